"""Pictures in episodes (chat/images.py, model/vision.py): a tool returns an image, the engine
puts the model's placeholders for it in the ids (masked from the loss), and the trainer's
log-probs, with the pixels in its forward, equal the sampler's (contract 1)."""

from __future__ import annotations

import random
from pathlib import Path
from dataclasses import replace

import pytest
import torch
from PIL import Image as PILImage
from PIL import ImageDraw
from transformers import Qwen2Config

from toolpolicy.build import trainable_policy
from toolpolicy.chat import HermesTemplate
from toolpolicy.config import ModelSection
from toolpolicy.chat.images import IMAGE_PAD, VISION_TOKENS, ImageSpan, ImagesUnreadable, image_runs
from toolpolicy.model import PolicyModel
from toolpolicy.model.embedded import train_tokenizer
from toolpolicy.model.vision import VisionShape, build_vision_model
from toolpolicy.rollout import EpisodeLimits, HFBackend, RolloutEngine, ScriptedBackend
from toolpolicy.tools import ToolSet, tool
from toolpolicy.tools.images import png
from toolpolicy.trainer.batch import FULL_SEQUENCES, SHARED_PROMPTS, collate, micro_batches
from toolpolicy.types import Image, Message, Task, ToolCall

TEMPLATE = HermesTemplate.compact()


def drawing(text: str, size: int = 48) -> Image:
    picture = PILImage.new("RGB", (size, size), "white")
    ImageDraw.Draw(picture).text((4, size // 3), text, fill="black")
    return png(picture)


@tool
def zoom(x: int, y: int) -> Image:
    """Look closer at a region of the picture.

    Args:
        x: left edge of the region.
        y: top edge of the region.
    """
    return drawing(f"{x}{y}")


ZOOM = Message("assistant", "", (ToolCall("zoom", {"x": 1, "y": 2}),))


class PictureEnv:
    """Each task shows a picture; the model may zoom (a picture comes back) and answers."""

    name = "pictures"
    tools = ToolSet([zoom])
    system_prompt = "Read the code in the picture."
    default_rewards = {"correct_answer": 1.0}
    success_reward = "correct_answer"

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        rng = random.Random(seed)
        return [Task(f"p{i}", "What is the code?", str(rng.randint(10, 99))) for i in range(n)]

    def initial_messages(self, task: Task) -> list[Message]:
        return [Message("system", self.system_prompt), Message("user", task.prompt, images=(drawing(task.answer),))]

    def on_answer(self, task: Task, messages: list[Message]) -> list[Message] | None:
        return None


@pytest.fixture(scope="module")
def vision_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random VLM (CLIP tower + Qwen2, as LLaVA) saved as any checkpoint."""
    env = PictureEnv()
    spans = replace(TEMPLATE, image_span=ImageSpan(lambda image: 4))
    texts = [
        spans.render(env.initial_messages(t) + [ZOOM, Message("tool", "", name="zoom", images=(drawing("1"),)), Message("assistant", t.answer)], env.tools.specs())
        for t in env.tasks("train", 40, seed=0)
    ]
    tokenizer = train_tokenizer(texts, 300, TEMPLATE, VISION_TOKENS)
    text = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    model = build_vision_model(tokenizer, text, VisionShape(image_size=16, patch=8, hidden_size=32, layers=1), seed=0)
    folder = tmp_path_factory.mktemp("vlm")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def vision_policy(vision_folder: Path) -> PolicyModel:
    return PolicyModel.load(vision_folder)


@pytest.mark.parametrize("train_vision", [False, True])
def test_training_leaves_the_vision_tower_alone_unless_asked(vision_folder, tmp_path, train_vision):
    for lora in (0, 4):
        section = ModelSection(train_vision=train_vision, lora_rank=lora, lora_target_modules=["q_proj", "v_proj"])
        policy = trainable_policy(section, vision_folder, tmp_path / f"lora{lora}", resuming=False)
        trained = {name for name, p in policy.model.named_parameters() if p.requires_grad}
        assert any("vision_tower." in name for name in trained) == train_vision
        assert any("multi_modal_projector." in name for name in trained) == (lora == 0)
        assert any("language_model." in name for name in trained)


def test_a_vision_checkpoint_loads_with_its_image_span(vision_policy):
    assert vision_policy.vision is not None and vision_policy.vision.pads(drawing("1")) == 4
    assert vision_policy.chat.image_span is not None
    rendered = vision_policy.chat.render([Message("user", "hi", images=(drawing("1"),))])
    assert rendered.count(IMAGE_PAD) == 4 and rendered.index(IMAGE_PAD) < rendered.index("hi")


def test_a_text_model_refuses_a_picture_with_a_clear_error():
    from toolpolicy.rollout import Trajectory
    from toolpolicy.types import Episode

    with pytest.raises(ImagesUnreadable, match="no vision encoder"):
        TEMPLATE.render([Message("tool", "", name="zoom", images=(drawing("1"),))])
    shown = Trajectory([5, 9, 9, 6], [0, 0, 0, 1], [0.0] * 4, 3, Episode(Task("t", "", ""), []), images=[(1, drawing("1"))])
    with pytest.raises(ImagesUnreadable, match="no vision encoder"):  # the trainer's batch, without the model's VisionInput
        collate([shown], 0)


def test_pictures_reach_the_ids_masked_and_the_trainer_agrees_with_the_sampler(vision_policy):
    """Turn 0 is a scripted zoom (a picture comes back), turn 1 samples after the picture in the
    prompt and the one in the observation: the trainer's log-probs of it, with the pixels in
    both recompute paths and in micro-batches, equal the sampler's."""
    from test_chat_families import _FirstTurnScripted

    policy = vision_policy
    tasks = [t for t in PictureEnv().tasks("train", 4, seed=1) for _ in range(3)]
    scripted = ScriptedBackend({i: [ZOOM] for i in range(len(tasks))}, policy.chat.render_assistant, policy.encode)
    sampled = HFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0), vision=policy.vision)
    limits = EpisodeLimits(max_turns=2, max_tokens=800, max_turn_tokens=96)
    trajectories = RolloutEngine(PictureEnv(), policy.chat, policy.encode, policy.decode, _FirstTurnScripted(scripted, sampled), limits).run(tasks)
    pad = policy.encode(IMAGE_PAD)[0]
    for t in trajectories:
        assert len(t.images) == 2 and len(t.turn_spans) == 2, t.episode.messages
        runs = image_runs(t.token_ids, pad)
        assert [start for start, _ in runs] == [position for position, _ in t.images] and all(end - start == 4 for start, end in runs)
        assert all(t.loss_mask[p] == 0 for start, end in runs for p in range(start, end))
        start, end = t.turn_spans[0]
        t.loss_mask[start:end] = [0] * (end - start)  # the scripted turn was not sampled
    batch = collate(trajectories, policy.pad_id, policy.vision)
    assert batch.pixels.shape == (24, 3, 16, 16) and batch.pixel_at[:, 0].tolist() == [row for row in range(12) for _ in range(2)]
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) >= 12
    with torch.no_grad():
        for recompute in (FULL_SEQUENCES, SHARED_PROMPTS):
            values, _ = recompute.logprobs(policy.model, batch, 1.0)
            assert torch.allclose(values[mask], batch.old_logprobs[mask], atol=1e-4), float((values[mask] - batch.old_logprobs[mask]).abs().max())
        pieces = micro_batches(batch, 5)
        assert [int(piece.pixels.shape[0]) for _, piece in pieces] == [10, 10, 4]
        for _, piece in pieces:
            values, _ = SHARED_PROMPTS.logprobs(policy.model, piece, 1.0)
            piece_mask = piece.loss_mask.bool()
            assert torch.allclose(values[piece_mask], piece.old_logprobs[piece_mask], atol=1e-4)
        blind, _ = FULL_SEQUENCES.logprobs(policy.model, batch._replace(pixels=torch.zeros_like(batch.pixels)), 1.0)
        assert not torch.allclose(blind[mask], batch.old_logprobs[mask], atol=1e-4)  # the pixels matter


def test_a_picture_after_a_cached_turn_goes_into_the_cache_with_its_pixels(vision_policy):
    """The sampler's KV cache continues an episode whose new fragment shows a picture: the second
    turn's log-probs equal a full forward over the whole episode with both pictures."""
    from toolpolicy.rollout.backends import GenRequest

    policy = vision_policy
    env = PictureEnv()
    (task,) = env.tasks("train", 1, seed=3)
    backend = HFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0), vision=policy.vision)
    engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, EpisodeLimits())
    start = engine.start(task)
    first = backend.generate([GenRequest(0, start.token_ids, 6, images=tuple(start.images))])[0]
    start.append(first.ids, sampled=True, logprobs=first.logprobs)
    observation = [Message("tool", "", name="zoom", images=(drawing("77"),))]
    fragment = policy.encode(policy.chat.render_observation(observation, after=Message("assistant", "")))
    start.append(fragment, sampled=False, images=engine._placed(fragment, observation))
    prefilled = backend.counts["prefill"]
    second = backend.generate([GenRequest(0, start.token_ids, 6, images=tuple(start.images))])[0]
    assert backend.counts["prefill"] - prefilled == len(fragment) + 1  # the cache went on: the last sampled token and the fragment
    start.append(second.ids, sampled=True, logprobs=second.logprobs)
    batch = collate([start], policy.pad_id, policy.vision)
    with torch.no_grad():
        values, _ = FULL_SEQUENCES.logprobs(policy.model, batch, 1.0)
    mask = batch.loss_mask.bool()
    assert torch.allclose(values[mask], batch.old_logprobs[mask], atol=1e-4)
