"""Generation backends: given token-id prefixes, sample the next assistant turn.

A backend never sees text or messages, only ids, so that what it returns is
appended to the trajectory unchanged (docs/architecture.md, contract 1). `HFBackend` runs any
local Hugging Face causal LM, keeping each episode's KV cache across its turns; `ScriptedBackend` replays fixed
assistant messages through the same engine, which is how SFT demonstrations
are tokenized and how the engine is tested without a model.
"""

from __future__ import annotations

import copy
import inspect
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers.cache_utils import DynamicCache

from toolpolicy.model.adapters import merged, merged_weights
from toolpolicy.model.placement import compute_dtype, in_compute_dtype, linear_weights_in
from toolpolicy.model.vision import VisionInput, pixels_for, unsampled_ids, without_ids
from toolpolicy.rollout.kv_cache import Forward, RowCache, cache_argument, position_bytes
from toolpolicy.rollout.prefix_attention import PrefixRows, register, shares_prefixes
from toolpolicy.types import Image, Message


@dataclass(frozen=True)
class GenRequest:
    """Continue episode `key` from `ids` for at most `max_new_tokens` tokens."""

    key: int
    ids: list[int]
    max_new_tokens: int
    seed: int | None = None
    """Seed of the episode's own random stream, which its later turns continue; None: draws
    come from the backend's generator for the whole batch. With its own stream an episode's
    samples do not depend on which other episodes share its batch or process."""
    images: tuple[tuple[int, Image], ...] = ()
    """The pictures `ids` shows, each with the position of its first placeholder (a
    vision-language policy's; Trajectory.images)."""


@dataclass(frozen=True)
class Generation:
    """Sampled ids (including the stop token when one was hit), their logprobs, and
    whether the turn ended on a stop token (False: cut by the token budget)."""

    ids: list[int]
    logprobs: list[float]
    finished: bool


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared once on its class (`capabilities`); the trainer and the
    config checks read it (rollout/catalog.py's `capabilities_of`), never a backend's name. A
    request seed a backend would not use is refused when the config is loaded, never dropped."""

    request_seeds: bool
    """Each request may carry its own seed and draws its tokens from that stream alone
    (rl.sampling_streams: episode, torchrun, Ray workers)."""
    exact_logprobs: bool
    """Its log-probabilities are the trainer's own forward's numbers at the same temperature,
    so the update needs no correction for the sampler (algorithm.correction: auto -> none)."""
    in_process: bool
    """Samples from a torch module in the trainer's process, so a copy of the policy in a
    thread can sample while the trainer updates (rl.max_staleness)."""


def unseeded(requests: list[GenRequest], backend: str) -> list[GenRequest]:
    """`requests`, if none carries a seed or a picture: a backend without `request_seeds`
    refuses a seed instead of sampling it from its own stream as though it were honoured, and
    one that passes no pixels refuses a picture instead of sampling as though it saw it."""
    if any(request.seed is not None for request in requests):
        raise ValueError(f"backend {backend} takes no seed per request (rl.sampling_streams: episode needs backend hf)")
    if any(request.images for request in requests):
        raise ValueError(f"backend {backend} passes no pictures to the model (episodes that show pictures need backend hf)")
    return requests


class Backend(Protocol):
    capabilities: Capabilities

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        """Continue each request's ids; a request with the `key` of an earlier one continues that episode."""

    def forget(self) -> None:
        """Drop what is kept about the episodes so far (the engine calls it when a batch of episodes ends)."""

    def sync(self, model: torch.nn.Module) -> None:
        """Sample from `model`'s current weights from now on (RL calls it after each optimizer step)."""

    @property
    def counts(self) -> Counter[str]:
        """Token positions run so far, by kind (prefill, decode), for the step's `tokens/*` metrics."""

    def close(self) -> None:
        """Release what the backend holds beyond the trainer's model (a vLLM engine and its worker)."""


class HFBackend:
    """Batched sampling on a local transformers model, keeping each episode's KV cache across turns.

    The first turn of a batch prefills each distinct prompt once (a group's samples share
    it). Later turns continue the cached rows (toolpolicy.rollout.kv_cache): only the ids
    appended since (the stop token, the observation) are run through the model, so no
    turn re-reads the conversation. A request whose ids do not extend its episode's cached
    ids starts a new row from its full ids, so the cache changes how often a token is
    computed, never what. `forget()` drops every row (the engine calls it after each batch
    of episodes; the next batch runs on updated weights).

    Log-probabilities are those of the distribution actually sampled from
    (logits / temperature), which is what the trainer recomputes. `counts` tallies the
    token positions run through the model: prefill (prompts and appended tokens) and
    decode (one per row of the decode batch per sampling step; a stopped row stays in
    that batch, and is counted, until a quarter of the batch has stopped).

    Its KV cache is bounded by `cache_bytes`, half for the batch being decoded, half for the
    rows kept for their next turn: requests run in batches of at most `max_batch` rows whose
    cache (each row as long as the batch's longest gets this turn) fits in the first half, and
    rows that do not fit in the second are dropped after their turn and prefilled from their
    full ids if their episode goes on (more computation, the same tokens). A request alone
    always runs, whatever its length.
    """

    capabilities = Capabilities(request_seeds=True, exact_logprobs=True, in_process=True)

    def __init__(
        self,
        model: torch.nn.Module,
        stop_ids: list[int],
        pad_id: int,
        generator: torch.Generator,
        temperature: float = 1.0,
        max_batch: int = 128,
        cache_bytes: int = 2**31,
        vision: VisionInput | None = None,
    ) -> None:
        self.model = model
        self.stop_ids = torch.tensor(stop_ids)
        self.stop_set = set(stop_ids)
        self.pad_id = pad_id
        self.generator = generator
        self.temperature = temperature
        self.max_batch = max_batch
        self.cache_bytes = cache_bytes
        self.position_bytes = position_bytes(model, compute_dtype(model))
        self.counts: Counter[str] = Counter()
        self.share = False
        """Rows that start from one prompt share it (RowCache.prefill's `share`)."""
        self._forward = _forward_of(model, vision)
        self._rows: list[RowCache | None] = []  # None: released mid-turn
        self._streams: dict[int, torch.Generator] = {}

    def forget(self) -> None:
        """Drop every cached row and episode stream (call after the weights changed, or when a
        batch of episodes ended)."""
        self._rows = []
        self._streams = {}

    def _stream(self, request: GenRequest) -> torch.Generator:
        """The episode's generator: seeded on its first turn, continued on the next ones."""
        stream = self._streams.get(request.key)
        if stream is None:
            stream = self._streams[request.key] = torch.Generator().manual_seed(request.seed)
        return stream

    def sync(self, model: torch.nn.Module) -> None:
        """Nothing to push: this backend samples from the trainer's own model. The cached rows
        were computed under the old weights."""
        self.forget()

    def close(self) -> None:
        self.forget()

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                return self._generate(requests)
        finally:
            self.model.train(was_training)

    def _generate(self, requests: list[GenRequest]) -> list[Generation]:
        picks: dict[int, tuple[int, int]] = {}  # request -> the (piece, row) of the cache it continues
        for i, request in enumerate(requests):
            for piece, rows in enumerate(self._rows):
                row = rows.extends(request.key, request.ids) if rows is not None else None
                if row is not None:
                    picks[i] = (piece, row)
                    break
        device = next(self.model.parameters()).device
        out: dict[int, Generation] = {}
        pieces: list[RowCache] = []
        batches = self.batches(requests, list(picks))
        last_use = {picks[i][0]: k for k, batch in enumerate(batches) for i in batch}  # piece -> the last batch reading it
        self._rows = [rows if piece in last_use else None for piece, rows in enumerate(self._rows)]
        for k, batch in enumerate(batches):
            cached = [self._rows[piece].ids[row] for piece, row in (picks[i] for i in batch)]
            added = [requests[i].ids[len(ids) :] for i, ids in zip(batch, cached)]
            room = max(map(len, added)) + max(requests[i].max_new_tokens for i in batch)
            rows = RowCache.gather(self._rows, [picks[i] for i in batch], [requests[i].key for i in batch], cached, room)
            self._rows = [None if last_use.get(piece) == k else kept for piece, kept in enumerate(self._rows)]  # all gathered
            shown = [[image for at, image in requests[i].images if at >= len(ids)] for i, ids in zip(batch, cached)]
            rows.append(added, self._forward, self.pad_id, self.counts, shown)
            out.update(zip(batch, self._decode(rows, [requests[i] for i in batch], pieces)))
        for batch in self.batches(requests, [i for i in range(len(requests)) if i not in picks]):
            keys, prompts = [requests[i].key for i in batch], [requests[i].ids for i in batch]
            room = max(requests[i].max_new_tokens for i in batch)
            shown = [[image for _, image in requests[i].images] for i in batch]
            rows = RowCache.prefill(keys, prompts, self._forward, self.pad_id, device, self.counts, room, shown, self.share)
            out.update(zip(batch, self._decode(rows, [requests[i] for i in batch], pieces)))
        self._rows = pieces
        return [out[i] for i in range(len(requests))]

    def batches(self, requests: list[GenRequest], items: list[int] | None = None) -> list[list[int]]:
        """The indices of `requests` (or those in `items`), in order, cut into the batches this
        sampler runs: at most `max_batch` rows whose cache, every row as long as the longest
        one gets this turn (its ids and new tokens), fits in half of `cache_bytes`; a request
        too long for it runs alone."""
        batches: list[list[int]] = []
        held = Held()
        for i in range(len(requests)) if items is None else items:
            grown = held.plus(requests[i], self.share)
            fits = bool(batches) and len(batches[-1]) < self.max_batch
            if fits and grown.positions(self.share) * self.position_bytes <= self.cache_bytes // 2:
                batches[-1].append(i)
                held = grown
            else:
                batches.append([i])
                held = Held().plus(requests[i], self.share)
        return batches

    def _sample(self, logits: torch.Tensor, streams: list[torch.Generator] | None, live: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One token per row and its log-probability under the sampling distribution.
        With per-episode `streams`, only the `live` rows [B] draw (one uniform each), so an
        episode's stream advances by exactly the tokens it sampled."""
        if self.temperature <= 0:  # greedy; logprob reported at temperature 1
            logp = torch.log_softmax(logits, dim=-1)  # [B, V]
            token = logits.argmax(dim=-1)  # [B]
        elif streams is None:
            logp = torch.log_softmax(logits / self.temperature, dim=-1)  # [B, V]
            # Drawn on the CPU generator on every device, so a seed gives the same run anywhere.
            token = torch.multinomial(logp.exp().cpu(), 1, generator=self.generator).squeeze(-1).to(logits.device)  # [B]
        else:
            logp = torch.log_softmax(logits / self.temperature, dim=-1)  # [B, V]
            uniform = torch.zeros(len(streams))  # [B]
            for row in torch.nonzero(live).flatten().tolist():
                uniform[row] = torch.rand((), generator=streams[row])
            token = inverse_cdf_sample(logp.exp().cpu(), uniform).to(logits.device)  # [B]
        return token, logp.gather(-1, token[:, None]).squeeze(-1)

    def _decode(self, rows: RowCache, requests: list[GenRequest], pieces: list[RowCache]) -> list[Generation]:
        """Sample every row until it stops or spends its budget. Rows that are done leave the
        decode batch (once they are a quarter of it), parked with their cache; every piece,
        settled with the tokens its rows kept, is added to `pieces` for the next turn while
        `pieces` stays within half of `cache_bytes`.

        Every step samples for every row, done or not, in request order (the done ones from
        their last logits, the draw then discarded), so the generator's draws, and with them
        the samples, do not depend on when rows leave the batch."""
        device = rows.attention.device
        budget = torch.tensor([r.max_new_tokens for r in requests], device=device)  # [B]
        batch = len(requests)
        stop_ids = self.stop_ids.to(device)
        done = budget <= 0  # [B]
        finished = torch.zeros(batch, dtype=torch.bool, device=device)  # [B]
        logits = rows.logits.clone()  # [B, V]
        live = list(range(batch))  # the request of each row of `rows`
        parked: list[tuple[RowCache, list[int]]] = []
        tokens, logprobs = [], []
        streams = [self._stream(r) for r in requests] if all(r.seed is not None for r in requests) else None
        for step in range(int(budget.max())):
            token, logp = self._sample(logits, streams, ~done)
            tokens.append(token)
            logprobs.append(logp)
            hit_stop = torch.isin(token, stop_ids) & ~done
            finished |= hit_stop
            done |= hit_stop | (budget <= step + 1)
            if bool(done.all()):
                break
            leaving = [k for k, i in enumerate(live) if done[i]]
            if 4 * len(leaving) >= len(live):
                staying = [k for k, i in enumerate(live) if not done[i]]
                parked.append((rows.take(leaving, 0), [live[k] for k in leaving]))
                rows, live = rows.take(staying, int(budget.max()) - 1 - step), [live[k] for k in staying]
            index = torch.tensor(live, device=device)
            logits[index] = rows.feed(token[index], self._forward, self.counts)
        results = [Generation([], [], False) for _ in requests]
        if tokens:
            sampled = torch.stack(tokens, dim=1).tolist()  # [B, steps]
            sampled_logp = torch.stack(logprobs, dim=1).tolist()  # [B, steps]
            for row in range(batch):
                ids = sampled[row]
                n = min(len(ids), requests[row].max_new_tokens)
                stop = next((i for i in range(n) if ids[i] in self.stop_set), None)
                n = n if stop is None else stop + 1
                results[row] = Generation(ids[:n], sampled_logp[row][:n], bool(finished[row]))
        for piece, members in parked + [(rows, live)]:
            piece.settle([len(results[i].ids) for i in members])
            if sum(kept.nbytes() for kept in pieces) + piece.nbytes() <= self.cache_bytes // 2:
                pieces.append(piece)  # else dropped: its rows start over from their ids next turn
        return results


@dataclass(frozen=True)
class Held:
    """What the cache of a batch being cut holds: its rows, the widest one (its ids and new
    tokens), and with `share` its distinct prompts, the longest of them and the most new tokens."""

    rows: int = 0
    widest: int = 0
    prompts: frozenset[tuple[int, ...]] = frozenset()
    longest: int = 0
    most_new: int = 0

    def plus(self, request: GenRequest, share: bool) -> Held:
        ids, new = request.ids, request.max_new_tokens
        prompts = self.prompts | {tuple(ids)} if share else self.prompts
        return Held(self.rows + 1, max(self.widest, len(ids) + new), prompts, max(self.longest, len(ids)), max(self.most_new, new))

    def positions(self, share: bool) -> int:
        """Cache positions: every row as wide as the widest, or with `share` each distinct
        prompt once (left-padded to the longest) and every row room for its new tokens."""
        return len(self.prompts) * self.longest + self.rows * self.most_new if share else self.rows * self.widest


class FoldedHFBackend(HFBackend):
    """HFBackend sampling from a copy of the policy made for sampling (`sampling_copy`): its
    LoRA adapter folded into the weights (one product a projection instead of three) and
    every linear weight, the output head's too, stored in the compute dtype (no cast at any
    decoded token). `sync` loads the trained weights into the copy after each update.

    The copy rounds W + BA once where the trainer computes W x and B(A x) apart, so its
    log-probabilities are not the trainer's own numbers (`exact_logprobs` is False):
    algorithm.correction auto then weighs each token by truncated importance sampling, and the
    `mismatch/*` metrics measure the gap. Costs a second copy of the weights (270 MB for
    SmolLM2-135M in bfloat16).

    The episodes of a group share their prompt's cache (`share`, for a text model whose
    attention rollout/prefix_attention.py can take over): stored once, read once a step for
    all of them."""

    capabilities = Capabilities(request_seeds=True, exact_logprobs=False, in_process=True)

    def __init__(self, model: torch.nn.Module, *args, vision: VisionInput | None = None, **kwargs) -> None:
        sampler = sampling_copy(model)
        share = vision is None and shares_prefixes(sampler)
        if share:
            register(sampler)
        super().__init__(sampler, *args, vision=vision, **kwargs)
        self.share = share

    def sync(self, model: torch.nn.Module) -> None:
        """Load `model`'s current weights, its adapter folded in, into the copy."""
        self.model.load_state_dict(merged_weights(model))
        self.forget()


def sampling_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` that only samples, computing in its compute dtype: a LoRA adapter
    folded in (`merged_weights`: one rounding of W + BA, as vLLM takes it) and every linear
    weight stored in that dtype (`linear_weights_in`)."""
    dtype = compute_dtype(model)
    copied = merged(copy.deepcopy(model)).eval()
    copied.requires_grad_(False)
    in_compute_dtype(copied, dtype)  # a merged peft model's own forward was not an entry point
    linear_weights_in(copied, dtype)
    copied.load_state_dict(merged_weights(model))
    return copied


def _forward_of(model: torch.nn.Module, vision: VisionInput | None = None) -> Forward:
    """One forward step with a KV cache, returning the last position's logits [B, V] (float32)
    and the cache. Only the last position's logits are computed where the model allows it.
    The pictures the rows show go in as `vision`'s pixels, row by row (none: a text step)."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    cache_name = cache_argument(model)
    never = unsampled_ids(model)
    last_only = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(core.forward).parameters else {}

    def forward(
        ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache: DynamicCache | None,
        shown: Sequence[Sequence[Image]], prefix: PrefixRows | None = None,
    ) -> tuple[torch.Tensor, DynamicCache]:
        pictures = [image for row in shown for image in row]
        pixels = {"pixel_values": pixels_for(vision, pictures).to(ids.device)} if pictures else {}
        shared = {"shared_prefix": prefix} if prefix is not None else {}
        output = model(
            input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True, **{cache_name: cache}, **last_only,
            **pixels, **shared,
        )
        return without_ids(output.logits[:, -1].float(), never), getattr(output, cache_name)

    return forward


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
        self.counts: Counter[str] = Counter()

    def forget(self) -> None:
        """Nothing to drop: each episode's script position is kept, so a script runs once."""

    def sync(self, model: torch.nn.Module) -> None:
        """Nothing to sync: scripts do not depend on weights."""

    def close(self) -> None:
        """Nothing to release."""

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


def inverse_cdf_sample(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The token each row's uniform draw falls on in its cumulative distribution: an exact
    sample of `probs` [B, V] from one number in [0, 1) per row [B]."""
    cdf = probs.cumsum(-1)  # [B, V]
    target = uniform[:, None] * cdf[:, -1:]  # [B, 1], scaled to the row's total against rounding
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp(max=probs.shape[-1] - 1)  # [B]
