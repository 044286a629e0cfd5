"""Qwen2.5-VL as a chat family: pictures in its own format, counted and positioned as the model does.

The reference is the model's own pipeline, built offline: trl's `qwen2_5_vl.jinja` (the official
template) and the qwen2.5 tokenizer (tests/families.py) in a `Qwen2_5_VLProcessor` with a locally
built `Qwen2VLImageProcessor`, and a tiny random `Qwen2_5_VLForConditionalGeneration` with the real
vocabulary. The project's side: `JinjaTemplate` rendering pictures with `QwenVision`'s span, the
engine's fragments tokenized one by one, `QwenVision.pixels` and `mrope_positions`
(model/qwen_vl.py).
"""

from __future__ import annotations

import doctest
import re
from dataclasses import replace

import pytest
import torch
from PIL import Image as PILImage
from PIL import ImageDraw
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor, Qwen2VLImageProcessor

import toolpolicy.chat.jinja
import toolpolicy.model.qwen_vl
from toolpolicy.chat import ChatFormatError, JinjaTemplate
from toolpolicy.chat.images import IMAGE_PAD, image_runs
from toolpolicy.chat.tools_block import tools_block
from toolpolicy.model import codec
from toolpolicy.model.qwen_vl import QwenVision, mrope_positions
from toolpolicy.model.gguf import trl_template
from toolpolicy.tools.images import png
from toolpolicy.types import Image, Message, ToolCall, ToolSpec

from families import build_tokenizer, chat_template, fragment_ids

VL_TEMPLATE = trl_template("qwen2_5_vl.jinja")
ZOOM = ToolSpec("zoom", "Look closer at a region.", {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]})
CALL = ToolCall("zoom", {"x": 3}, "abcdef123")


class PictureProcessor(Qwen2_5_VLProcessor):
    """Qwen2.5-VL's processor without its video processor (that one needs torchvision, which is
    not installed): text and pictures go through Qwen2_5_VLProcessor's own code."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


def drawing(width: int, height: int, text: str) -> PILImage.Image:
    canvas = PILImage.new("RGB", (width, height), "white")
    ImageDraw.Draw(canvas).text((2, height // 3), text, fill="black")
    return canvas


TALL, WIDE = drawing(60, 100, "7"), drawing(90, 40, "42")
"""Two pictures of different grids: (1, 8, 4) patches (8 pads) and (1, 4, 6) (6 pads)."""


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("qwen2.5")


@pytest.fixture(scope="module")
def processor(tokenizer) -> PictureProcessor:
    return PictureProcessor(image_processor=Qwen2VLImageProcessor(), tokenizer=tokenizer, chat_template=VL_TEMPLATE)


@pytest.fixture(scope="module")
def vision(processor, tokenizer) -> QwenVision:
    return QwenVision(processor.image_processor, tokenizer.convert_tokens_to_ids(IMAGE_PAD))


@pytest.fixture(scope="module")
def template(tokenizer, vision) -> JinjaTemplate:
    """The official template has no tools section: tools go in a Hermes block (chat_tools: system)."""
    return replace(JinjaTemplate.of(tokenizer, source=VL_TEMPLATE, tools="system"), image_span=vision.span)


@pytest.fixture(scope="module")
def model(tokenizer) -> Qwen2_5_VLForConditionalGeneration:
    """A tiny random Qwen2.5-VL: 2 text layers of 64 (head 32, M-RoPE sections 4+6+6), a vision
    tower of depth 1 and width 32, the qwen2.5 tokenizer's vocabulary."""
    config = Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, rope_parameters={"rope_type": "default", "mrope_section": [4, 6, 6], "rope_theta": 1e6},
        ),
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, fullatt_block_indexes=[0]),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def conversation() -> tuple[list[Message], Message, list[Message], Message]:
    """(opening, first reply, the user turn after it, last reply): a picture in each user turn."""
    opening = [Message("system", "You read pictures."), Message("user", "What is the number?", images=(png(TALL),))]
    return opening, Message("assistant", "It is 7."), [Message("user", "And this one?", images=(png(WIDE),))], Message("assistant", "42.")


def reference_messages() -> list[dict]:
    """`conversation()` as the processor reads it, written by hand."""
    return [
        {"role": "system", "content": "You read pictures."},
        {"role": "user", "content": [{"type": "image", "image": TALL}, {"type": "text", "text": "What is the number?"}]},
        {"role": "assistant", "content": "It is 7."},
        {"role": "user", "content": [{"type": "image", "image": WIDE}, {"type": "text", "text": "And this one?"}]},
        {"role": "assistant", "content": "42."},
    ]


def reference(processor, messages: list[dict], tools=None) -> dict:
    return processor.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=True, return_tensors="pt")


def test_doctests() -> None:
    assert doctest.testmod(toolpolicy.model.qwen_vl).failed == 0
    assert doctest.testmod(toolpolicy.chat.jinja).failed == 0


@pytest.mark.parametrize("size", [(56, 56), (60, 100), (90, 40), (20, 20), (300, 30), (1500, 900)])
def test_placeholders_per_picture_are_the_processors(vision, processor, size) -> None:
    """Exact multiples, rounding, the minimum area (scaled up) and the maximum (scaled down)."""
    picture = PILImage.new("RGB", size, "gray")
    made = processor.image_processor(images=[picture], return_tensors="pt")
    image = png(picture)
    assert vision.grid(image) == tuple(made["image_grid_thw"][0].tolist())
    assert vision.pads(image) == int(made["image_grid_thw"][0].prod()) // processor.image_processor.merge_size**2
    pixels = vision.pixels([image])
    assert torch.equal(pixels.pixel_values, made["pixel_values"]) and torch.equal(pixels.image_grid_thw, made["image_grid_thw"])


def test_rendered_ids_equal_the_processors_with_pictures(template, tokenizer, processor, vision) -> None:
    """The engine's fragments, and the whole rendering, tokenize to the processor's ids with the
    pictures expanded; the pixels are the processor's."""
    opening, first, observation, last = conversation()
    expected = reference(processor, reference_messages())
    want = expected["input_ids"][0].tolist()
    ours = fragment_ids(template, codec(tokenizer)[0], opening, [(first, observation), (last, [])])
    assert want[: len(ours)] == ours and not tokenizer.decode(want[len(ours) :]).strip()
    encode, _ = codec(tokenizer)
    assert encode(template.render([*opening, first, *observation, last])) == want
    runs = image_runs(ours, vision.pad_id)
    assert [end - start for start, end in runs] == [8, 6] == [vision.pads(png(TALL)), vision.pads(png(WIDE))]
    pixels = vision.pixels([png(TALL), png(WIDE)])
    assert torch.equal(pixels.pixel_values, expected["pixel_values"]) and torch.equal(pixels.image_grid_thw, expected["image_grid_thw"])


def test_a_tool_result_with_a_picture_in_the_hermes_block(template, tokenizer, processor) -> None:
    """chat_tools: system: the call in the assistant's text, the result a user turn of
    `<tool_response>` with the tool's picture before it, as the processor renders those turns."""
    opening = [Message("system", "You read pictures."), Message("user", "Zoom in.")]
    call = Message("assistant", "", (CALL,))
    result = [Message("tool", "zoomed at 3", name="zoom", tool_call_id=CALL.id, images=(png(WIDE),))]
    answer = Message("assistant", "42.")
    messages = [
        {"role": "system", "content": "You read pictures.\n\n" + tools_block([ZOOM])},
        {"role": "user", "content": "Zoom in."},
        {"role": "assistant", "content": '<tool_call>\n{"name": "zoom", "arguments": {"x": 3}}\n</tool_call>'},
        {"role": "user", "content": [{"type": "image", "image": WIDE}, {"type": "text", "text": "<tool_response>\nzoomed at 3\n</tool_response>"}]},
        {"role": "assistant", "content": "42."},
    ]
    want = reference(processor, messages)["input_ids"][0].tolist()
    ours = fragment_ids(template, codec(tokenizer)[0], opening, [(call, result), (answer, [])], tools=[ZOOM])
    assert want[: len(ours)] == ours and not tokenizer.decode(want[len(ours) :]).strip()


def test_pictures_need_a_template_that_reads_them_and_text_cannot_forge_a_placeholder(template, tokenizer, vision) -> None:
    encode, _ = codec(tokenizer)
    spelled = Message("user", f"{IMAGE_PAD}{IMAGE_PAD} is not a picture", images=(png(TALL),))
    ids = encode(template.render_prompt([spelled]))
    assert ids.count(vision.pad_id) == vision.pads(png(TALL)) == 8
    shown = [Message("user", "What is it?", images=(png(TALL),))]
    text_only = replace(JinjaTemplate.of(tokenizer, source=chat_template("qwen2.5")), image_span=vision.span)
    with pytest.raises(ChatFormatError, match="does not read pictures"):  # it fails on content parts
        text_only.render_prompt(shown)
    blind = replace(template, source=VL_TEMPLATE.replace("<|vision_start|><|image_pad|><|vision_end|>", ""))
    with pytest.raises(ChatFormatError, match=re.escape(f"wrote 0 {IMAGE_PAD} for 1 picture")):  # it reads them but writes no placeholder
        blind.render_prompt(shown)


def rows(template: JinjaTemplate, tokenizer) -> list[tuple[list[int], list[Image]]]:
    """Rows with 0, 1 and 2 pictures (of different grids), text before, between and after."""
    encode, _ = codec(tokenizer)
    opening, first, observation, last = conversation()
    shapes = [[opening[0], Message("user", "No picture."), first], [*opening, first], [*opening, first, *observation, last]]
    return [(encode(template.render(messages)), [image for m in messages for image in m.images]) for messages in shapes]


def test_positions_equal_the_models_get_rope_index(template, tokenizer, vision, model) -> None:
    """One right-padded batch of the rows through the model's get_rope_index: each row's
    positions on its tokens, and the position after it (length plus the model's rope delta)."""
    batch = rows(template, tokenizer)
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), tokenizer.pad_token_id)  # [B, L]
    attention = torch.zeros_like(ids)  # [B, L]
    for row, (tokens, _) in enumerate(batch):
        ids[row, : len(tokens)], attention[row, : len(tokens)] = torch.tensor(tokens), 1
    grids = torch.tensor([vision.grid(image) for _, images in batch for image in images])  # [3 pictures, 3]
    positions, deltas = model.model.get_rope_index(ids, (ids == vision.pad_id).int(), image_grid_thw=grids, attention_mask=attention)
    for row, (tokens, images) in enumerate(batch):
        ours, after = vision.positions(tokens, images)
        assert torch.equal(ours, positions[:, row, : len(tokens)]), row
        assert after == len(tokens) + int(deltas[row]), row
    assert [len(images) for _, images in batch] == [0, 1, 2]


def test_a_fragment_continues_from_the_position_after_its_prefix(template, tokenizer, vision) -> None:
    """What a KV cache needs: positions of a row cut anywhere in its text are the prefix's and
    the rest's from the prefix's next position; a grid that does not fit its run is an error."""
    tokens, images = rows(template, tokenizer)[2]
    whole, after = vision.positions(tokens, images)
    second = image_runs(tokens, vision.pad_id)[1][0]
    for cut in (1, second - 3, second - 1, len(tokens) - 1):
        shown = sum(start < cut for start, _ in image_runs(tokens, vision.pad_id))
        head, next_position = vision.positions(tokens[:cut], images[:shown])
        tail, end = vision.positions(tokens[cut:], images[shown:], start=next_position)
        assert torch.equal(torch.cat([head, tail], dim=1), whole) and end == after
    with pytest.raises(ValueError, match="shorter"):
        mrope_positions(tokens, [(1, 8, 6), (1, 4, 6)], vision.pad_id)
    with pytest.raises(ValueError, match="more runs"):
        mrope_positions(tokens, [(1, 8, 4)], vision.pad_id)


def test_forward_with_these_positions_equals_the_models_own(template, tokenizer, processor, vision, model) -> None:
    """The logits of the tiny model on the rendered ids with QwenVision's pixels and
    mrope_positions equal the model's forward on the processor's output computing positions
    itself; one-per-token positions differ; and a KV cache continued with a fragment that shows
    the second picture, at positions from the prefix's next one, gives the whole forward's logits."""
    opening, first, observation, last = conversation()
    expected = reference(processor, reference_messages())
    tokens = fragment_ids(template, codec(tokenizer)[0], opening, [(first, observation), (last, [])])
    images = [png(TALL), png(WIDE)]
    positions, _ = vision.positions(tokens, images)  # [3, L]
    ids = torch.tensor([tokens])  # [1, L]
    with torch.no_grad():
        own = model(**expected).logits[0, : len(tokens)]  # [L, V]: position_ids=None, from mm_token_type_ids and the grids
        ours = model(input_ids=ids, position_ids=positions[:, None], **vision.pixels(images)._asdict()).logits[0]
        flat = model(input_ids=ids, position_ids=torch.arange(len(tokens))[None], **vision.pixels(images)._asdict()).logits[0]
        assert torch.allclose(ours, own, atol=1e-5), float((ours - own).abs().max())
        assert not torch.allclose(flat, own, atol=1e-3)

        cut = image_runs(tokens, vision.pad_id)[1][0] - 5  # in the text before the second picture
        head, next_position = vision.positions(tokens[:cut], images[:1])
        cached = model(input_ids=ids[:, :cut], position_ids=head[:, None], use_cache=True, **vision.pixels(images[:1])._asdict())
        tail, _ = vision.positions(tokens[cut:], images[1:], start=next_position)
        rest = model(
            input_ids=ids[:, cut:], position_ids=tail[:, None], cache=cached.cache, use_cache=True, **vision.pixels(images[1:])._asdict()
        ).logits[0]
        assert torch.allclose(torch.cat([cached.logits[0], rest]), own, atol=1e-5)
