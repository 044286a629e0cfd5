"""Vision-language models: pictures as the pixels a model's forward takes, and the embedded VLM.

A vision-language policy reads each picture as a run of `<|image_pad|>` placeholders in its
token ids (chat/images.py); its forward takes the pictures' pixels beside the ids and puts
the vision encoder's features in place of the placeholders, in order. `VisionInput` is
what the rest of the project needs of such a model: how many placeholders a picture takes,
and the pixels of a list of pictures.

The embedded VLM is LLaVA's arrangement built small: a CLIP vision tower (a ViT over
PATCH-pixel patches of an IMAGE_SIZE-pixel square), a two-layer projector, and the embedded
Qwen2 as its language model, saved as a `LlavaForConditionalGeneration` so every stage loads
it like any Hugging Face checkpoint. Each picture is resized to the square (bilinear, RGB),
scaled to [0, 1] and normalised with mean and std 0.5 (this project's convention for the
embedded model; a pretrained LLaVA's own processor statistics would differ), and becomes
(IMAGE_SIZE / PATCH)^2 placeholders: the tower's patch features without its class token.
Positions stay one per token, so the KV cache and every log-prob path work as for text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image as PILImage
from transformers import CLIPVisionConfig, LlavaConfig, LlavaForConditionalGeneration, PreTrainedTokenizerBase, Qwen2Config

from toolpolicy.chat.images import IMAGE_PAD, ImageSpan, ImagesUnreadable
from toolpolicy.tools.images import picture
from toolpolicy.types import Image

VISION_MODEL_TYPES = frozenset({"llava"})
"""Config model types loaded as vision-language policies (AutoModelForImageTextToText)."""


def reads_pictures(config: object) -> bool:
    """Whether a model of `config` is a vision-language model (VISION_MODEL_TYPES)."""
    return getattr(config, "model_type", None) in VISION_MODEL_TYPES


@dataclass(frozen=True)
class VisionShape:
    """Size of the embedded VLM's vision tower."""

    image_size: int = 32
    """Side of the square every picture is resized to, in pixels."""
    patch: int = 8
    """Side of one patch: (image_size / patch)^2 placeholders a picture."""
    hidden_size: int = 64
    layers: int = 2
    heads: int = 2


@dataclass(frozen=True)
class VisionInput:
    """A vision-language model's pictures: placeholders per picture and their pixels."""

    image_size: int
    patch: int
    pad_id: int
    """The id of IMAGE_PAD in the model's vocabulary."""

    def pads(self, image: Image) -> int:
        """Placeholders one picture takes (every picture is resized to the same square)."""
        return (self.image_size // self.patch) ** 2

    @property
    def span(self) -> ImageSpan:
        """The chat template's spelling of a picture for this model."""
        return ImageSpan(self.pads)

    @staticmethod
    def of(config: LlavaConfig) -> VisionInput:
        """A LLaVA model's pictures, from its config."""
        return VisionInput(config.vision_config.image_size, config.vision_config.patch_size, config.image_token_index)

    def pixels(self, images: Sequence[Image]) -> torch.Tensor:
        """The pictures as the forward's pixel_values.   -> [n, 3, image_size, image_size]"""
        return torch.stack([self._pixels(image) for image in images]) if images else torch.zeros(0, 3, self.image_size, self.image_size)

    def _pixels(self, image: Image) -> torch.Tensor:
        resized = picture(image).resize((self.image_size, self.image_size), PILImage.BILINEAR)
        values = torch.from_numpy(np.asarray(resized, dtype=np.float32) / 255.0)  # [S, S, 3]
        return (values.permute(2, 0, 1) - 0.5) / 0.5  # [3, S, S]


def pixels_for(vision: VisionInput | None, images: Sequence[Image]) -> torch.Tensor:
    """`vision.pixels(images)` [n, 3, S, S]; ImagesUnreadable when there are pictures and the
    model reads none (the sampler's and the trainer's one check)."""
    if vision is None:
        raise ImagesUnreadable(f"the episodes show {len(images)} picture(s) but the model reads none (it has no vision encoder)")
    return vision.pixels(images)


def vision_input(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> VisionInput | None:
    """What `model` needs to read pictures, or None for a text-only model."""
    config = model.config
    if not reads_pictures(config):
        return None
    pad_id = tokenizer.convert_tokens_to_ids(IMAGE_PAD)
    if pad_id != config.image_token_index:
        raise ValueError(f"the tokenizer's {IMAGE_PAD} is id {pad_id}, the model's image token is {config.image_token_index}")
    return VisionInput.of(config)


def build_vision_model(tokenizer: PreTrainedTokenizerBase, text: Qwen2Config, shape: VisionShape, seed: int) -> LlavaForConditionalGeneration:
    """A freshly initialised embedded VLM: a CLIP tower of `shape`, a projector and a Qwen2 of `text`."""
    tower = CLIPVisionConfig(
        hidden_size=shape.hidden_size, intermediate_size=4 * shape.hidden_size, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, image_size=shape.image_size, patch_size=shape.patch,
    )
    config = LlavaConfig(
        text_config=text, vision_config=tower, image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_PAD),
        vision_feature_select_strategy="default", vision_feature_layer=-1, projector_hidden_act="gelu",
        tie_word_embeddings=text.tie_word_embeddings,
    )
    torch.manual_seed(seed)
    return LlavaForConditionalGeneration(config)


def freeze_vision_tower(model: torch.nn.Module) -> int:
    """Stop training `model`'s vision tower (a LoRA adapter on it included); its projector and
    language model train on. Returns the parameters frozen (0 for a text-only model)."""
    frozen = 0
    for name, parameter in model.named_parameters():
        if "vision_tower." in name and parameter.requires_grad:
            parameter.requires_grad_(False)
            frozen += parameter.numel()
    return frozen


def unsampled_ids(model: torch.nn.Module) -> list[int]:
    """Token ids the policy never samples: a vision model's image placeholder, which stands for
    pixels in its input and would break its next forward if it wrote one. The sampler and the
    trainer both leave them out of the distribution (their logits are -inf), so the two agree.

    >>> unsampled_ids(torch.nn.Linear(1, 1))
    []
    """
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(core, "config", None)
    if not reads_pictures(config):
        return []
    return [int(config.image_token_index)]


class WithoutIds(torch.nn.Module):
    """An output head whose logits of `ids` are -inf (see `unsampled_ids`)."""

    def __init__(self, head: torch.nn.Module, ids: list[int]) -> None:
        super().__init__()
        self.head, self.ids = head, ids

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return without_ids(self.head(hidden), self.ids)


def without_ids(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """`logits` [..., V] with the columns `ids` set to -inf (a copy; `logits` itself unchanged)."""
    if not ids:
        return logits
    masked = logits.clone()
    masked[..., ids] = float("-inf")
    return masked
