"""The embedded VLM's reading warm-up (model/reading.py) and zoom's reading pictures."""

from __future__ import annotations

import doctest
import random

import numpy as np
import pytest
import torch
from PIL import Image as PILImage
from PIL import ImageDraw
from transformers import Qwen2Config

from toolpolicy.chat import HermesTemplate
from toolpolicy.chat.images import VISION_TOKENS
from toolpolicy.build import load_config
from toolpolicy.config import ConfigError
from toolpolicy.envs import make_env
from toolpolicy.envs.zoom.env import PICTURE
from toolpolicy.model import reading
from toolpolicy.model.embedded import train_tokenizer
from toolpolicy.model.vision import VisionShape, build_vision_model
from toolpolicy.tools.images import picture, png
from toolpolicy.trainer.demonstrations import reading_warm_up
from toolpolicy.types import Reading


def test_the_module_examples_hold():
    assert doctest.testmod(reading).failed == 0


def square_readings(n: int, seed: int) -> list[Reading]:
    """16-pixel pictures with a dark or a red square in one quadrant, labelled by its colour;
    their text is the colour's initial, twice for a square in the lower half."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        row, col = rng.randrange(2), rng.randrange(2)
        label, colour = rng.choice([("dark", (20, 20, 20)), ("red", (220, 30, 30))])
        image = PILImage.new("RGB", (16, 16), (230, 230, 230))
        ImageDraw.Draw(image).rectangle((col * 8 + 1, row * 8 + 1, col * 8 + 6, row * 8 + 6), fill=colour)
        out.append(Reading(png(image), ((label, (col * 8 + 1, row * 8 + 1, col * 8 + 7, row * 8 + 7)),), label[0] * (1 + row)))
    return out


def tiny_vlm() -> torch.nn.Module:
    tokenizer = train_tokenizer(["hello world"] * 20, 300, HermesTemplate.compact(), VISION_TOKENS)
    text = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    return build_vision_model(tokenizer, text, VisionShape(image_size=16, patch=8, hidden_size=32, layers=1), seed=0)


def test_the_warm_up_teaches_the_tower_where_things_are_and_leaves_the_language_model_alone():
    readings = square_readings(400, seed=0)
    before = tiny_vlm()
    untrained = reading.warm_up_reading(before, readings, steps=0, seed=0)
    model = tiny_vlm()
    language = {k: v.clone() for k, v in model.model.language_model.state_dict().items()}
    tower = {k: v.clone() for k, v in model.model.vision_tower.state_dict().items()}
    score = reading.warm_up_reading(model, readings, steps=150, seed=0)
    assert score.labels == 2 and score.pictures == 400
    assert score.patch_accuracy >= 0.95 and untrained.patch_accuracy < 0.7  # 0.7: above the chance of an untrained probe
    assert score.text_accuracy >= 0.95 and untrained.text_accuracy < 0.7
    assert all(torch.equal(v, model.model.language_model.state_dict()[k]) for k, v in language.items())
    assert any(not torch.equal(v, model.model.vision_tower.state_dict()[k]) for k, v in tower.items())
    assert all(p.grad is None for p in model.parameters())


def test_the_warm_up_refuses_pictures_without_labels():
    blank = Reading(png(PILImage.new("RGB", (16, 16))), ())
    with pytest.raises(ValueError, match="labelled pictures"):
        reading.warm_up_reading(tiny_vlm(), [blank] * 10, steps=1, seed=0)


def test_zoom_labels_each_digit_where_it_is_drawn_and_the_pink_square():
    readings = make_env("zoom").reading_pictures(60, seed=0)
    digits = [r for r in readings if any(not label.startswith("mark") for label, _ in r.regions)]
    marks = [r for r in readings if any(label.startswith("mark") for label, _ in r.regions)]
    placed = [label for r in readings for label, _ in r.regions if label.startswith("mark at ")]
    assert len(digits) > 10 and len(marks) > 10 and len(set(placed)) > 5
    for item in readings:
        pixels = np.asarray(picture(item.image)).astype(int)
        for label, (left, top, right, bottom) in item.regions:
            inside = pixels[int(top) : int(np.ceil(bottom)), int(left) : int(np.ceil(right))]
            if label.startswith("mark"):  # pink: red well above green
                assert (inside[..., 0] - inside[..., 1]).mean() > 30
                if label != "mark":  # in a first view, the zoom's x and y of the cell it marks
                    scale = PICTURE / item.image.width
                    assert label == f"mark at {round(left * scale)},{round(top * scale)}"
            else:  # a digit is drawn in black in its box
                place, digit = label.split(":")
                assert place in "012" and digit.isdigit() and inside.min() < 90
    hard_zooms = [r for r in readings if len(r.regions) == 4]  # the pink square and its three digits at 1:1
    assert hard_zooms and all(r.regions[0] == ("mark", (0.0, 0.0, 64.0, 64.0)) for r in hard_zooms)
    for item in readings:  # the text is the code wherever its digits are drawn legibly, and nothing elsewhere
        code = "".join(label.split(":")[1] for label, _ in item.regions if not label.startswith("mark"))
        assert item.text == code and len(code) in (0, 3)


def test_reading_steps_need_an_environment_with_reading_pictures(tmp_path):
    cfg = load_config(None, ["env.name=calc", "embedded.image_size=16", "embedded.reading_steps=5"])
    with pytest.raises(ConfigError, match="embedded.reading_steps.*calc"):
        reading_warm_up(cfg)
    assert reading_warm_up(load_config(None, ["env.name=zoom", "embedded.image_size=16"])) is None
