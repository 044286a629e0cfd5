"""Peak memory and time of the real commands on a real pretrained model (SmolLM2-135M-Instruct).

    python bench/real_model_memory.py /work/models/smollm2 [--label after] [--parts bfcl,calc_eval,sft,rl]

Each part is the `toolpolicy` command a user would run, in a process of its own with
`--threads` threads (one part at a time), its peak RSS read from the kernel when it exits
(`os.wait4`):

- bfcl:      `eval --bfcl v4 --categories simple_python,live_multiple --limit 8`
- bfcl_long: `eval --bfcl FILE` on BFCL v4's 16 longest prompts (the 8 longest of live_multiple
             and of live_irrelevance, up to 6,839 tokens; written to a BFCL-shaped file)
- calc_eval: `eval` on calc, 48 tasks x 2 trials (96 short episodes)
- sft:       `sft` with LoRA rank 16, batches of 8, 3 steps, on 16 BFCL live_simple
             questions answered with their first possible answer (OpenAI chat JSONL)
- rl:        `train` on calc from the model with LoRA rank 16, 4 tasks x groups of 4, 2 steps
- sft_auto, rl_auto: the same with `dtype: auto` (bfloat16 autocast on a CPU with AVX512-BF16 or AMX)

sft and rl run micro-batches of at most TRAIN_TOKENS[dtype] positions (`micro_batch_tokens`):
the activations of this model's backward pass take about 2.5 MB a position in float32, half
that in bfloat16.

The model's own chat template drops the tools, so every part renders in Hermes format
with trl's Qwen2.5 template. Figures go to bench/results/real_model_memory.json under
`--label` (the parts and labels already in the file are kept), with the CPU and its flags.
The "before" figures there come from commit 6f5db30, run with PYTHONPATH at a copy of its
src/ whose `eval` was given `--limit` (the list slicing alone); it had neither
micro_batch_tokens nor dtype auto, so its sft and rl ran micro-batches of 32 rows in float32.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from result_file import machine, write_result  # bench/ is on the path of a script run from it

from toolpolicy.config import migrate

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "real_model_memory.json"
PARTS = ("bfcl", "bfcl_long", "calc_eval", "sft", "rl", "sft_auto", "rl_auto")
BFCL_CATEGORIES = "simple_python,live_multiple"
BFCL_LIMIT = 8
LONG_CATEGORIES = ("live_multiple", "live_irrelevance")
TRAIN_TOKENS = {"float32": 512, "auto": 1024}


def qwen_template() -> Path:
    import trl

    return Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"


def sft_records(path: Path, count: int) -> None:
    """`count` BFCL v4 live_simple questions, each answered by one call with its first possible answer."""
    from toolpolicy.chat.records import chat_record
    from toolpolicy.eval.bfcl_v4 import load_v4
    from toolpolicy.types import Message, ToolCall

    lines = []
    for entry in load_v4(("live_simple",))[:count]:
        ((name, params),) = entry.expected[0].items()
        arguments = {key: values[0] for key, values in params.items() if values and values[0] != ""}
        answer = Message("assistant", "", (ToolCall(name.replace(".", "_"), arguments),))
        lines.append(json.dumps(chat_record([*entry.messages, answer], entry.specs())))
    path.write_text("\n".join(lines) + "\n")


def longest_entries(path: Path, template: Path, model: Path, count: int) -> None:
    """The `count` entries of each of LONG_CATEGORIES with the longest prompts in the model's
    chat format, as a BFCL-shaped JSONL file (`eval --bfcl FILE`)."""
    from transformers import AutoTokenizer

    from toolpolicy.eval.bfcl_v4 import load_v4
    from toolpolicy.model import ChatChoice, chat_template, codec

    tokenizer = AutoTokenizer.from_pretrained(model)
    chat, (encode, _) = chat_template(tokenizer, ChatChoice("hermes", str(template))), codec(tokenizer)
    rows = []
    for category in LONG_CATEGORIES:
        entries = sorted(load_v4((category,)), key=lambda e: -len(encode(chat.render_prompt(e.messages, e.specs()))))[:count]
        rows += [
            {"id": e.id, "category": category, "question": [[{"role": m.role, "content": m.content} for m in e.messages]],
             "function": e.shown or e.functions, "ground_truth": e.expected}
            for e in entries
        ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def run(command: list[str], threads: int) -> dict[str, float]:
    """Run one `toolpolicy` command; its wall time and the peak RSS of its process."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "toolpolicy", *command], env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise subprocess.CalledProcessError(process.returncode, command)
    return {"seconds": round(time.perf_counter() - start, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def step_figures(run_dir: Path, phase: str) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if row["phase"] == phase]
    return {
        "steps": len(rows),
        "s_per_step": [round(row["time/step"], 2) for row in rows],
        "logged_peak_mb": max(row["memory/peak_mb"] for row in rows),
    }


def training(phase: str, work: Path, model: Path, dtype: str) -> dict[str, Any]:
    """The settings of the sft or rl part in `dtype`."""
    common = {"lora_rank": 16, "dtype": dtype, "micro_batch_tokens": TRAIN_TOKENS[dtype]}
    if phase == "sft":
        return {"sft_data": str(work / "sft.jsonl"), "sft_batch_size": 8, "sft_steps": 3, "sft_warmup_steps": 1, **common}
    return {
        "env": "calc", "init_from": str(model), "prompts_per_step": 4, "group_size": 4, "rl_steps": 2, "dynamic_sampling": False,
        "store_rollouts": False, **common,
    }


def measure(model: Path, part: str, work: Path, threads: int) -> dict[str, Any]:
    base = {
        "model": str(model), "chat_format": "hermes", "chat_template": str(qwen_template()), "threads": threads,
        "run_dir": str(work / part), "audit": False, "checkpoint_every": 10_000,
    }
    settings: dict[str, Any] = {
        "bfcl": {"eval_checkpoint": str(model)},
        "bfcl_long": {"eval_checkpoint": str(model)},
        "calc_eval": {"env": "calc", "eval_checkpoint": str(model), "eval_tasks": 48, "eval_samples": 2, "samples_in_report": 0},
    }.get(part) or training(part.removesuffix("_auto"), work, model, "auto" if part.endswith("_auto") else "float32")
    config = work / f"{part}.yaml"
    config.write_text(yaml.safe_dump(migrate({**base, **settings})))  # the fields by their flat names, written in sections
    command = {
        "bfcl": ["eval", str(config), "--bfcl", "v4", "--categories", BFCL_CATEGORIES, "--limit", str(BFCL_LIMIT)],
        "bfcl_long": ["eval", str(config), "--bfcl", str(work / "longest.jsonl")],
        "calc_eval": ["eval", str(config)],
    }.get(part) or ["sft" if part.startswith("sft") else "train", str(config)]
    if part.startswith("sft"):
        sft_records(work / "sft.jsonl", 16)
    if part == "bfcl_long":
        longest_entries(work / "longest.jsonl", qwen_template(), model, BFCL_LIMIT)
    result: dict[str, Any] = {"command": " ".join(["toolpolicy", *command[:1], f"{part}.yaml", *command[2:]]), "settings": settings}
    result.update(run(command, threads))
    if part.startswith(("sft", "rl")):
        result.update(step_figures(work / part, part.removesuffix("_auto")))
    if part in ("bfcl", "bfcl_long"):
        result["entries"] = BFCL_LIMIT * 2
        result["s_per_entry"] = round(result["seconds"] / result["entries"], 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", type=Path, help="a Hugging Face model folder (SmolLM2-135M-Instruct)")
    parser.add_argument("--label", default="after", help="the key the figures are stored under (e.g. before, after)")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        for part in args.parts.split(","):
            figures[part] = measure(args.model.resolve(), part, Path(folder), args.threads)
            print(part, json.dumps(figures[part]), flush=True)
    runs = json.loads(OUT.read_text())["runs"] if OUT.is_file() else {}
    parts = {**runs.get(args.label, {}).get("parts", {}), **figures}  # a label's other parts are kept
    runs[args.label] = {"threads": args.threads, "parts": parts, "machine": machine()}
    write_result(OUT, {"model": args.model.name, "runs": runs})


if __name__ == "__main__":
    main()
