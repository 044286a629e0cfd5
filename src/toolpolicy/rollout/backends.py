"""Generation backends: given token-id prefixes, sample the next assistant turn.

A backend never sees text or messages, only ids, so that what it returns is
appended to the trajectory unchanged (DESIGN contract 1). `HFBackend` runs any
local Hugging Face causal LM with a KV cache; `ScriptedBackend` replays fixed
assistant messages through the same engine, which is how SFT demonstrations
are tokenized and how the engine is tested without a model.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Protocol

import torch

from toolpolicy.types import Message


@dataclass(frozen=True)
class GenRequest:
    """Continue episode `key` from `ids` for at most `max_new_tokens` tokens."""

    key: int
    ids: list[int]
    max_new_tokens: int


@dataclass(frozen=True)
class Generation:
    """Sampled ids (including the stop token when one was hit), their logprobs, and
    whether the turn ended on a stop token (False: cut by the token budget)."""

    ids: list[int]
    logprobs: list[float]
    finished: bool


class Backend(Protocol):
    def generate(self, requests: list[GenRequest]) -> list[Generation]: ...


def _cache_kwarg(model: torch.nn.Module) -> str:
    """transformers renamed `past_key_values` to `cache`; accept both versions."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class HFBackend:
    """Batched sampling with a KV cache on a local transformers model.

    Prefixes are left-padded into one batch, prefilled once, then decoded one
    token per step for the whole batch. Rows that have stopped keep decoding
    (their tokens are discarded) so the cache stays rectangular; the batch ends
    when every row has stopped or spent its budget. Log-probabilities are those
    of the distribution actually sampled from (logits / temperature), which is
    what the trainer recomputes.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        stop_ids: list[int],
        pad_id: int,
        generator: torch.Generator,
        temperature: float = 1.0,
        max_batch: int = 128,
    ) -> None:
        self.model = model
        self.stop_ids = torch.tensor(stop_ids)
        self.stop_set = set(stop_ids)
        self.pad_id = pad_id
        self.generator = generator
        self.temperature = temperature
        self.max_batch = max_batch
        self._cache_name = _cache_kwarg(model)

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(requests), self.max_batch):
            out.extend(self._generate_batch(requests[start : start + self.max_batch]))
        return out

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row and its log-probability under the sampling distribution."""
        if self.temperature <= 0:  # greedy; logprob reported at temperature 1
            logp = torch.log_softmax(logits, dim=-1)  # [B, V]
            token = logits.argmax(dim=-1)  # [B]
        else:
            logp = torch.log_softmax(logits / self.temperature, dim=-1)  # [B, V]
            # Drawn on the CPU generator on every device, so a seed gives the same run anywhere.
            token = torch.multinomial(logp.exp().cpu(), 1, generator=self.generator).squeeze(-1).to(logits.device)  # [B]
        return token, logp.gather(-1, token[:, None]).squeeze(-1)

    @torch.no_grad()
    def _generate_batch(self, requests: list[GenRequest]) -> list[Generation]:
        was_training = self.model.training
        self.model.eval()
        batch, width = len(requests), max(len(r.ids) for r in requests)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)  # [B, W]
        attention = torch.zeros((batch, width), dtype=torch.long)  # [B, W]
        for row, request in enumerate(requests):
            input_ids[row, width - len(request.ids) :] = torch.tensor(request.ids)
            attention[row, width - len(request.ids) :] = 1
        device = next(self.model.parameters()).device
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # [B, W]
        budget = torch.tensor([r.max_new_tokens for r in requests], device=device)  # [B]

        output = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True)
        cache = getattr(output, self._cache_name)
        logits = output.logits[:, -1].float()  # [B, V]
        tokens, logprobs = [], []
        done = budget <= 0  # [B]
        finished = torch.zeros(batch, dtype=torch.bool, device=device)  # [B]
        stop_ids = self.stop_ids.to(device)
        for step in range(int(budget.max())):
            token, logp = self._sample(logits)
            tokens.append(token)
            logprobs.append(logp)
            hit_stop = torch.isin(token, stop_ids) & ~done
            finished |= hit_stop
            done |= hit_stop | (budget <= step + 1)
            if bool(done.all()):
                break
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=torch.long, device=device)], dim=-1)
            positions = positions[:, -1:] + 1  # [B, 1]
            output = self.model(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=positions,
                use_cache=True,
                **{self._cache_name: cache},
            )
            cache = getattr(output, self._cache_name)
            logits = output.logits[:, -1].float()
        if was_training:
            self.model.train()
        if not tokens:
            return [Generation([], [], False) for _ in requests]
        sampled = torch.stack(tokens, dim=1)  # [B, steps]
        sampled_logp = torch.stack(logprobs, dim=1)  # [B, steps]
        results = []
        for row in range(batch):
            ids = sampled[row].tolist()
            n = min(len(ids), int(budget[row]))
            stops = [i for i in range(n) if ids[i] in self.stop_set]
            n = stops[0] + 1 if stops else n
            results.append(Generation(ids[:n], sampled_logp[row, :n].tolist(), bool(finished[row])))
        return results


class ScriptedBackend:
    """Replays fixed assistant messages, one per turn, for each episode key.

    Each message is rendered with the chat template (`render`: Message -> text
    ending in the stop string) and tokenized as one fragment, exactly what the
    SFT loss then trains on. Log-probabilities are 0: nothing was sampled.
    """

    def __init__(self, scripts: dict[int, list[Message]], render, encode) -> None:
        self.scripts = scripts
        self.render = render
        self.encode = encode
        self.turn: dict[int, int] = {}

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        out = []
        for request in requests:
            turn = self.turn.get(request.key, 0)
            self.turn[request.key] = turn + 1
            script = self.scripts[request.key]
            if turn >= len(script):
                raise IndexError(f"script for episode {request.key} has no turn {turn}: the expert ended too early")
            ids = self.encode(self.render(script[turn]))
            finished = len(ids) <= request.max_new_tokens
            ids = ids[: request.max_new_tokens]
            out.append(Generation(ids, [0.0] * len(ids), finished))
        return out
