"""The KV cache of a batch of episodes, kept across their turns.

One row per episode in a rectangular cache. Each turn the rows of the episodes that go on
are gathered into a fresh cache holding only their real tokens (right-aligned, padding on
the left), the ids appended since the last turn are run in one left-padded block, and
decoding writes into spare room of preallocated buffers (sized for the turn's tokens)
instead of concatenating at every step. Padding and the tokens a row sampled after its stop
are masked out of attention and skipped by the position ids, so every real token attends to
exactly its own history.

Rows that start from one prompt (a group's episodes) may share it instead of each holding a
copy (`prefill(share=True)`): the prompt's keys and values are stored once
(rollout/prefix_attention.py's `SharedPrefix`), a row's cache holds only the columns after
it, and the model's attention reads the prompt once for all of its rows.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from toolpolicy.rollout.prefix_attention import PrefixRows, SharedPrefix
from toolpolicy.types import Image

Forward = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache | None, Sequence[Sequence[Image]], PrefixRows | None],
    tuple[torch.Tensor, DynamicCache],
]
"""(ids [B, S], attention [B, T+S], position ids [B, S], cache or None, the pictures each row
of `ids` shows, in order, the shared prompts the rows' columns follow or None) -> (the last
position's logits [B, V] in float32, the cache holding T+S columns)."""

def cache_argument(model: torch.nn.Module) -> str:
    """The name under which `model`'s forward takes and returns its KV cache: transformers
    renamed `past_key_values` to `cache`."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(core.forward).parameters else "past_key_values"


def position_bytes(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of KV cache one token position of one row takes in `model` computing in `dtype`:
    keys and values of every layer."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * dtype.itemsize


class GrowingLayer(DynamicLayer):
    """A cache layer whose keys and values are views of larger buffers, with `room` spare
    columns: an update writes the new columns in place instead of `torch.cat` (past the
    room, the buffers double: amortised O(1) per token)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        super().__init__()
        columns = keys.shape[-2]
        self._keys = keys.new_empty(*keys.shape[:-2], columns + room, keys.shape[-1])
        self._values = values.new_empty(*values.shape[:-2], columns + room, values.shape[-1])
        self._keys[..., :columns, :] = keys
        self._values[..., :columns, :] = values
        self.length = columns
        self.keys, self.values = self._keys[..., :columns, :], self._values[..., :columns, :]
        self.device = keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            size = max(end, 2 * self._keys.shape[-2])
            self._keys = _grown(self._keys, start, size)
            self._values = _grown(self._values, start, size)
        self._keys[..., start:end, :] = key_states
        self._values[..., start:end, :] = value_states
        self.length = end
        self.keys, self.values = self._keys[..., :end, :], self._values[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("rows of a RowCache are selected by RowCache.gather")


def _grown(buffer: torch.Tensor, used: int, size: int) -> torch.Tensor:
    bigger = buffer.new_empty(*buffer.shape[:-2], size, buffer.shape[-1])
    bigger[..., :used, :] = buffer[..., :used, :]
    return bigger


def left_padded(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sequences left-padded into ids [B, W], their attention [B, W] and each token's offset
    among its row's real tokens [B, W] (0 on padding)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, seq in enumerate(seqs):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq)
            attention[row, width - len(seq) :] = 1
    offsets = (attention.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), attention.to(device), offsets.to(device)


def shared_prefix(prompts: list[list[int]]) -> int:
    """How many leading ids every one of several prompts shares, each keeping at least one of
    its own (the logits of its last id are the ones sampled from); 0 for a single prompt."""
    if len(prompts) < 2:
        return 0
    shortest = min(map(len, prompts))
    common = 0
    while common < shortest - 1 and len({p[common] for p in prompts}) == 1:
        common += 1
    return common


def real_columns(attention: torch.Tensor, width: int) -> torch.Tensor:
    """For each row, the indices of its real columns, right-aligned into [B, width] (width
    at least the most real columns of any row); the padding on the left points at column 0."""
    # Sorting the column index of real columns, with padding keyed below every real one,
    # lines each row's real columns up at the right end in their order.
    columns = torch.arange(attention.shape[1], device=attention.device).expand_as(attention)
    keyed = torch.where(attention.bool(), columns, -1)  # [B, T]
    ordered = keyed.sort(dim=-1).values  # [B, T]
    if width > ordered.shape[1]:
        ordered = torch.cat([ordered.new_full((ordered.shape[0], width - ordered.shape[1]), -1), ordered], dim=-1)
    return ordered[:, ordered.shape[1] - width :].clamp(min=0)


@dataclass
class RowCache:
    """The KV cache of a batch of episodes, one row each, and what is in it.

    cache:     the model's cache, [rows, kv heads, T, head dim] per layer
    attention: [rows, T] 1 where the column holds a real token of the row
    next_pos:  [rows] the position id of each row's next token (its count of real tokens)
    keys, ids: each row's episode key and the real token ids its cache holds, in order
    logits:    [rows, V] the next-token logits after the last real token fed
    fed:       the tokens fed while decoding the current turn, one [rows] tensor per step
    prefix:    the prompts the rows share (None: each row's cache holds all of its tokens);
               `cache` and `attention` then hold only the columns after its prompt
    group:     [rows] each row's prompt in `prefix`
    """

    cache: DynamicCache
    attention: torch.Tensor
    next_pos: torch.Tensor
    keys: list[int]
    ids: list[list[int]]
    logits: torch.Tensor
    fed: list[torch.Tensor] = field(default_factory=list)
    prefix: SharedPrefix | None = None
    group: torch.Tensor | None = None

    @classmethod
    def prefill(
        cls, keys: list[int], prompts: list[list[int]], forward: Forward, pad_id: int, device: torch.device, counts: Counter[str],
        room: int, shown: Sequence[Sequence[Image]] | None = None, share: bool = False,
    ) -> RowCache:
        """Run each distinct prompt (its ids and the pictures it `shown`) once, left-padded, then
        give every row its prompt's cache, with `room` columns to grow into: a copy, or with
        `share` (text prompts only) the prompt itself, stored once for all of its rows. Text
        prompts that begin alike (one system prompt and tool list, different questions) run
        their common prefix once and then each its own rest (`shared_prefix`)."""
        shown = shown if shown is not None else [()] * len(prompts)
        distinct: dict[tuple[tuple[int, ...], tuple[bytes, ...]], int] = {}
        source = [distinct.setdefault((tuple(p), tuple(i.png for i in s)), len(distinct)) for p, s in zip(prompts, shown)]
        first = {index: row for row, index in reversed(list(enumerate(source)))}  # distinct prompt -> a row that has it
        unique = [list(p) for p, _ in distinct]
        pictures = [shown[first[u]] for u in range(len(distinct))]
        common = shared_prefix(unique) if not any(pictures) else 0
        if common:
            prefix = unique[0][:common]
            head = cls.run([prefix], [()], forward, pad_id, device, counts)
            rows = cls.gather([head], [(0, 0)] * len(unique), list(range(len(unique))), [prefix] * len(unique), max(map(len, unique)) - common)
            rows.append([p[common:] for p in unique], forward, pad_id, counts)
        else:
            rows = cls.run(unique, pictures, forward, pad_id, device, counts)
        if share and not any(pictures):
            return rows.shared(torch.tensor(source, device=device), keys, [list(p) for p in prompts], room)
        return cls.gather([rows], [(0, row) for row in source], keys, [list(p) for p in prompts], room)

    def shared(self, group: torch.Tensor, keys: list[int], ids: list[list[int]], room: int) -> RowCache:
        """Rows that continue these prompts (row i the prompt group[i]), which become their
        shared prefix; each row's own columns start empty, with `room` to grow into."""
        prefix = SharedPrefix(
            tuple(layer.keys.contiguous() for layer in self.cache.layers),
            tuple(layer.values.contiguous() for layer in self.cache.layers),
            self.attention,
        )
        cache = DynamicCache()
        cache.layers = [
            GrowingLayer(layer.keys[group, :, :0], layer.values[group, :, :0], room) for layer in self.cache.layers
        ]
        attention = self.attention.new_zeros((len(group), 0))
        return RowCache(cache, attention, self.next_pos[group], keys, ids, self.logits[group], prefix=prefix, group=group)

    def rows(self) -> PrefixRows | None:
        """What the attention needs of the shared prompts (None: there are none)."""
        return None if self.prefix is None else PrefixRows.of(self.prefix, self.group)

    @classmethod
    def run(
        cls, prompts: list[list[int]], shown: Sequence[Sequence[Image]], forward: Forward, pad_id: int, device: torch.device,
        counts: Counter[str],
    ) -> RowCache:
        """A cache of `prompts` (with the pictures each shows) run left-padded from nothing, one row each."""
        ids, attention, positions = left_padded(prompts, pad_id, device)  # [U, W] each
        counts["prefill"] += int(attention.sum())
        logits, cache = forward(ids, attention, positions, None, shown, None)
        return cls(cache, attention, attention.sum(-1), list(range(len(prompts))), prompts, logits)

    @classmethod
    def gather(
        cls, pieces: list[RowCache | None], picks: list[tuple[int, int]], keys: list[int], ids: list[list[int]], room: int
    ) -> RowCache:
        """A cache whose row i is a copy of row picks[i] = (piece, row) of `pieces`, holding only
        its real columns (right-aligned), in buffers with `room` columns to grow into; row i is
        episode keys[i] with cached ids ids[i]. Pieces that decoding split apart are joined
        again here (pieces no pick names may be None: already released). Rows that share
        prompts keep them shared: the prompts of every piece, joined into one prefix."""
        device = pieces[picks[0][0]].attention.device
        prefixes = {id(pieces[p].prefix): pieces[p].prefix for p, _ in picks if pieces[p].prefix is not None}  # each once, in order
        if prefixes and any(pieces[p].prefix is None for p, _ in picks):
            raise ValueError("RowCache.gather: rows with a shared prompt and rows without cannot share a cache")
        width = max(int(pieces[p].attention[r].sum()) for p, r in picks)
        layers = [[[], []] for _ in pieces[picks[0][0]].cache.layers]
        order: list[int] = []  # output row of each gathered row, piece by piece
        for index, piece in enumerate(pieces):
            mine = [(out, row) for out, (p, row) in enumerate(picks) if p == index]
            if not mine:
                continue
            rows = torch.tensor([row for _, row in mine], device=device)
            columns = real_columns(piece.attention[rows], width)  # [b, W]
            for layer, stacks in zip(piece.cache.layers, layers):
                for tensor, stack in zip((layer.keys, layer.values), stacks):
                    stack.append(tensor[rows[:, None], :, columns].permute(0, 2, 1, 3))  # [b, H, W, D]
            order += [out for out, _ in mine]
        back = torch.tensor(order, device=device).argsort()  # gathered order -> output order
        cache = DynamicCache()
        cache.layers = [GrowingLayer(torch.cat(k)[back], torch.cat(v)[back], room) for k, v in layers]
        real = torch.tensor([int(pieces[p].attention[r].sum()) for p, r in picks], device=device)  # [B]
        attention = (torch.arange(width, device=device)[None, :] >= (width - real)[:, None]).long()  # [B, W]
        next_pos = torch.stack([pieces[p].next_pos[r] for p, r in picks])
        logits = torch.stack([pieces[p].logits[r] for p, r in picks])
        if not prefixes:
            return cls(cache, attention, next_pos, keys, ids, logits)
        start, offset = {}, 0  # each prefix's first prompt in the joined one
        for key, known in prefixes.items():
            start[key], offset = offset, offset + known.attention.shape[0]
        group = torch.stack([pieces[p].group[r] + start[id(pieces[p].prefix)] for p, r in picks])
        return cls(cache, attention, next_pos, keys, ids, logits, prefix=SharedPrefix.joined(list(prefixes.values())), group=group)

    def take(self, rows: list[int], room: int) -> RowCache:
        """The cache of these rows alone (columns as they are), mid-turn included, with `room`
        columns to grow into."""
        index = torch.tensor(rows, device=self.attention.device)
        cache = DynamicCache()
        cache.layers = [GrowingLayer(layer.keys[index], layer.values[index], room) for layer in self.cache.layers]
        return RowCache(
            cache, self.attention[index], self.next_pos[index], [self.keys[r] for r in rows], [self.ids[r] for r in rows],
            self.logits[index], [token[index] for token in self.fed], self.prefix, None if self.group is None else self.group[index],
        )

    def nbytes(self) -> int:
        """Bytes the cache's buffers hold (spare room included), and of the shared prompts
        the share of those its rows use (pieces of one batch's rows together count them once)."""
        own = sum(
            buffer.numel() * buffer.element_size()
            for layer in self.cache.layers
            for buffer in ((layer._keys, layer._values) if isinstance(layer, GrowingLayer) else (layer.keys, layer.values))
        )
        if self.prefix is None:
            return own
        return own + self.prefix.nbytes() * len(set(self.group.tolist())) // self.prefix.attention.shape[0]

    def extends(self, key: int, ids: list[int]) -> int | None:
        """The row whose cached ids `ids` continue (same episode `key`, a strict prefix), else None."""
        if key not in self.keys:
            return None
        row = self.keys.index(key)
        cached = self.ids[row]
        return row if len(ids) > len(cached) and ids[: len(cached)] == cached else None

    def append(
        self, added: list[list[int]], forward: Forward, pad_id: int, counts: Counter[str], shown: Sequence[Sequence[Image]] | None = None
    ) -> None:
        """Run the ids each row adds (at least one each; with the pictures they show), left-padded into one block."""
        block, block_attention, offsets = left_padded(added, pad_id, self.attention.device)  # [B, S] each
        counts["prefill"] += sum(map(len, added))
        self.attention = torch.cat([self.attention, block_attention], dim=-1)
        pictures = shown if shown is not None else [()] * len(added)
        self.logits, self.cache = forward(block, self.attention, self.next_pos[:, None] + offsets, self.cache, pictures, self.rows())
        self.next_pos = self.next_pos + block_attention.sum(-1)
        self.ids = [ids + new for ids, new in zip(self.ids, added)]

    def feed(self, token: torch.Tensor, forward: Forward, counts: Counter[str]) -> torch.Tensor:
        """Run one sampled token per row; return the next logits [B, V]."""
        counts["decode"] += token.shape[0]
        column = torch.ones((token.shape[0], 1), dtype=self.attention.dtype, device=token.device)
        self.attention = torch.cat([self.attention, column], dim=-1)
        positions = self.next_pos[:, None] + len(self.fed)  # [B, 1]
        self.fed.append(token)
        self.logits, self.cache = forward(token[:, None], self.attention, positions, self.cache, [()] * token.shape[0], self.rows())
        return self.logits

    def settle(self, kept: list[int]) -> None:
        """After a turn in which row i kept its first kept[i] sampled tokens: mask the fed
        tokens it discarded (sampled after its stop) and record the kept ones. A row's last
        kept token is not in the cache yet; the next turn runs it with the observation."""
        steps = len(self.fed)
        if steps:
            n_kept = torch.tensor(kept, device=self.attention.device).clamp(max=steps)  # [B]
            real = torch.arange(steps, device=n_kept.device)[None, :] < n_kept[:, None]  # [B, steps]
            self.attention[:, -steps:] = real.to(self.attention.dtype)
            self.next_pos = self.next_pos + n_kept
            fed = torch.stack(self.fed, dim=1).tolist()  # [B, steps]
            self.ids = [ids + row[:n] for ids, row, n in zip(self.ids, fed, n_kept.tolist())]
        self.fed = []
