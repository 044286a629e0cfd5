"""Generation throughput of the two rollout backends on the same requests: HFBackend vs VLLMBackend.

96 first-turn calc prompts shaped as RL samples them (12 tasks x 8 samples of each), 64 new
tokens each with no stop id (every row runs its full budget, so both backends generate the
same number of tokens), temperature 1, float32, the same thread count for both. Each backend
first generates once on other prompts (kernels and allocations warm); each figure is then the
best of --repeats runs, since other jobs may share the machine. vLLM is timed with its prefix
cache emptied before each run (a group's samples still share their prompt within the run)
and with the prompts already cached; its start (spawning the worker, loading the model) is
reported apart. Models: the shipped calc-sft (1.8M parameters) and, with --wide, a
25.4M-parameter Qwen2 of the same tokenizer (8 layers, width 512, random weights:
throughput does not depend on them).

    .venv/bin/python bench/vllm_vs_hf.py [--threads 1,2] [--wide]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from toolpolicy.envs import make_env
from toolpolicy.model import PolicyModel
from toolpolicy.model.embedded import ModelShape, build_model, parameter_count
from toolpolicy.rollout import GenRequest, HFBackend
from toolpolicy.rollout.vllm_engine import VLLMBackend, VLLMSettings

from result_file import write_result  # bench/ is on the path of a script run from it

ROOT = Path(__file__).parent.parent
CALC_SFT = ROOT / "checkpoints" / "calc-sft"
WIDE = ModelShape(vocab_size=0, hidden_size=512, layers=8, heads=8, kv_heads=4, intermediate_size=1536)


def requests_of(policy: PolicyModel, tasks: int, samples: int, tokens: int, seed: int) -> list[GenRequest]:
    env = make_env("calc")
    prompts = [policy.encode(policy.chat.render_prompt(env.initial_messages(t), env.tools.specs())) for t in env.tasks("train", tasks, seed=seed)]
    return [GenRequest(i, prompts[i // samples], tokens) for i in range(tasks * samples)]


def best_of(repeats: int, generate, requests: list[GenRequest], before=lambda: None) -> dict[str, float]:
    """The fastest of `repeats` runs (`before` runs untimed ahead of each)."""
    runs = []
    for _ in range(repeats):
        before()
        began = time.perf_counter()
        generations = generate(requests)
        runs.append((time.perf_counter() - began, sum(len(g.ids) for g in generations)))
    seconds, tokens = min(runs)
    return {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}


def measure(folder: Path, threads: int, requests: list[GenRequest], warmup: list[GenRequest], repeats: int) -> dict[str, object]:
    torch.set_num_threads(threads)
    policy = PolicyModel.load(folder)
    hf = HFBackend(policy.model, [], policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    forget = getattr(hf, "forget", lambda: None)
    hf.generate(warmup)
    row: dict[str, object] = {"threads": threads, "hf": best_of(repeats, hf.generate, requests, forget)}
    began = time.perf_counter()
    vllm = VLLMBackend(folder, [], 1.0, VLLMSettings(kv_cache_gib=1.0, threads=threads))
    started = time.perf_counter() - began
    vllm.generate(warmup)
    row["vllm"] = {
        "start_seconds": round(started, 1),
        "prefix_cache_empty": best_of(repeats, vllm.generate, requests, vllm.llm.reset_prefix_cache),
        "prompts_cached": best_of(repeats, vllm.generate, requests),
    }
    vllm.close()
    print(json.dumps(row))
    return row


def build_wide(folder: Path) -> int:
    tokenizer = AutoTokenizer.from_pretrained(CALC_SFT)
    model = build_model(tokenizer, WIDE, seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    for name in ("chat_template.jinja", "generation_config.json"):
        (folder / name).write_bytes((CALC_SFT / name).read_bytes())
    return parameter_count(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts, each run by both backends")
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wide", action="store_true", help="also the 25.4M-parameter model")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "vllm_vs_hf.json"))
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    policy = PolicyModel.load(CALC_SFT)
    requests = requests_of(policy, args.tasks, args.samples, args.tokens, seed=1)
    warmup = requests_of(policy, 2, args.samples, args.tokens, seed=2)
    prompt_tokens = sum(len(r.ids) for r in requests)
    result: dict[str, object] = {
        "requests": len(requests), "tokens_per_request": args.tokens, "prompt_tokens": prompt_tokens,
        "cpu": platform.processor() or platform.machine(), "dtype": "float32", "repeats": args.repeats, "models": {},
    }
    models = {"calc-sft": (CALC_SFT, parameter_count(policy.model))}
    with tempfile.TemporaryDirectory() as scratch:
        if args.wide:
            models["wide-25m"] = (Path(scratch), build_wide(Path(scratch)))
        for name, (folder, parameters) in models.items():
            result["models"][name] = {"parameters": parameters, "runs": [measure(folder, t, requests, warmup, args.repeats) for t in threads]}
    write_result(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
