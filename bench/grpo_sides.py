"""One measured GRPO run on `calc`: toolpolicy's `train_rl`, or TRL's GRPOTrainer on the same work.

bench/trl_vs_toolpolicy.py starts this file once per run, each in a fresh process, so that
neither side inherits the other's thread pools, caches or allocator state:

    python bench/grpo_sides.py {toolpolicy|trl} WORKLOAD_JSON OUT_JSON

Both sides return one StepRecord per optimizer step. toolpolicy's step time is the
trainer's own `time/step` (rollout, scoring, advantages, update, optimizer step); TRL's is
the span from `on_step_begin` to `on_step_end` (generation with the tool loop, rewards,
advantages, every micro-batch's forward and backward, clipping, optimizer step). Neither
includes logging or checkpoint writing.

The counts per step come from each side's own records of what was sampled: toolpolicy's
trajectories (recorded by wrapping `toolpolicy.trainer.rl.sample_groups` for the run) and
the batch TRL's `_generate_and_score_completions` hands to its loss (completion mask times
tool mask), plus the messages TRL passes to the reward function. Each run also returns the
prompt ids of every episode, as the side sampled from them, for the driver to compare.

Each side imports its own library inside the functions that use it, so a toolpolicy run
never imports trl and the driver imports neither library (it asks `template_shows_tools`,
which needs transformers alone, before any run).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from result_file import write_result  # bench/ is on the path of a script run from it

if TYPE_CHECKING:
    from peft import LoraConfig
    from toolpolicy.config import Config
    from toolpolicy.rollout import Trajectory
    from transformers import PreTrainedTokenizerBase, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

SIDES = ("toolpolicy", "trl")
EXCESS_CALL_PENALTY = 0.5  # calc's default rubric: each call beyond the fewest the task needs


@dataclass(frozen=True)
class Workload:
    """The work both sides do in one run: `warmup_steps + steps` GRPO steps from `checkpoint`."""

    setting: str
    """single_turn (the model answers in one turn) or multi_turn (with the calculator)."""
    checkpoint: str
    lora_rank: int
    """Rank of the LoRA adapter both sides train (peft; toolpolicy's default target modules and
    dropout on both); 0 trains every weight."""
    lora_alpha: int
    """LoRA scaling numerator (the update is scaled by alpha / rank); 0 without LoRA."""
    dtype: str
    """Compute precision, float32 or bfloat16: toolpolicy's `dtype`, TRL's `bf16` (autocast;
    trainable weights stay float32, a LoRA model's frozen base is stored in this dtype)."""
    chat_tools: str
    """toolpolicy's `chat_tools`: template (the checkpoint's own tools section) or system
    (Qwen2.5's Hermes block in the system message). TRL's single-turn prompt is toolpolicy's
    rendering either way."""
    max_turns: int
    """Assistant turns per episode: 1, or 1 + the tool rounds TRL may run (max_tool_calling_iterations)."""
    max_completion_tokens: int
    """Tokens after the prompt, sampled and tool output together; also the most one turn may sample."""
    prompts: int
    """Tasks per step."""
    group_size: int
    """Samples per task."""
    micro_batch: int
    """Sequences per forward/backward; prompts * group_size / micro_batch micro-batches per step."""
    temperature: float
    lr: float
    seed: int
    warmup_steps: int
    """Steps run first and left out of the figures."""
    steps: int
    """Steps measured."""
    threads: int
    toolpolicy_set: list[str] = field(default_factory=list)
    """Extra `--set key=value` for toolpolicy's config (e.g. backend=vllm): how toolpolicy does
    the work, not what the work is, so never a field set above."""

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.steps

    @property
    def episodes(self) -> int:
        return self.prompts * self.group_size


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step did and how long it took."""

    seconds: float
    """The whole step: rollout (with tool calls), rewards, update, optimizer step."""
    rollout_seconds: float
    """Of which: sampling the episodes (tool calls included) and scoring them."""
    episodes: int
    sampled_tokens: int
    """Tokens the policy sampled and the loss covers; prompt and tool output excluded."""
    assistant_turns: int
    tool_calls: int
    """Calls that reached the calculator."""
    malformed_calls: int
    """Calls that did not parse; toolpolicy shows the model an error and gives it another turn,
    TRL reads the turn as a final answer (so it counts none)."""
    correct: int
    """Episodes that ended with the right `Answer:`."""


# --- toolpolicy ------------------------------------------------------------------------------


def toolpolicy_config(work: Workload, run_dir: Path) -> Config:
    """The config of `toolpolicy train` for this workload: GRPO advantages, token-mean
    loss, clip 0.2/0.28, no KL term and no KL metric, every group trained (no dynamic sampling)."""
    from toolpolicy.build import load_config

    fields = {
        "run.dir": str(run_dir), "env.name": "calc", "run.seed": work.seed, "run.threads": work.threads, "model.device": "cpu",
        "rl.init_from": work.checkpoint, "rl.steps": work.total_steps, "rl.lr": work.lr, "rl.warmup_steps": 0,
        "rl.prompts_per_step": work.prompts, "rl.group_size": work.group_size, "optim.micro_batch_size": work.micro_batch,
        "rl.temperature": work.temperature, "rollout.max_turns": work.max_turns,
        "rollout.max_tokens": work.max_completion_tokens, "rollout.max_turn_tokens": work.max_completion_tokens,
        "model.dtype": work.dtype, "model.chat_tools": work.chat_tools,
        **({"model.lora_rank": work.lora_rank, "model.lora_alpha": work.lora_alpha} if work.lora_rank else {}),
        "algorithm.advantage": "grpo", "algorithm.ratio_level": "token", "algorithm.aggregation": "token_mean",
        "algorithm.clip_low": 0.2, "algorithm.clip_high": 0.28, "algorithm.beta": 0.0, "algorithm.log_kl": False,
        "algorithm.dynamic_sampling": False, "algorithm.max_refill_rounds": 0, "rl.max_idle_steps": 0,
        "optim.grad_clip": 1.0, "optim.weight_decay": 0.0, "run.checkpoint_every": work.total_steps,
    }
    return load_config(None, [*(f"{key}={value}" for key, value in fields.items()), *work.toolpolicy_set])


def trajectory_counts(trajectories: list[Trajectory]) -> dict[str, int]:
    """A toolpolicy step's work, counted from its trajectories."""
    from toolpolicy.rewards import REWARD_FUNCTIONS

    episodes = [t.episode for t in trajectories]
    return {
        "episodes": len(trajectories),
        "sampled_tokens": sum(t.sampled_tokens for t in trajectories),
        "assistant_turns": sum(len(t.turn_spans) for t in trajectories),
        "tool_calls": sum(e.count("tool_call") + e.count("tool_error") for e in episodes),
        "malformed_calls": sum(e.count("invalid_call") for e in episodes),
        "correct": int(sum(REWARD_FUNCTIONS["correct_answer"](e) for e in episodes)),
    }


@contextmanager
def recorded_rollouts(batches: list[list[Trajectory]]) -> Iterator[None]:
    """While open, every step's trajectories in `train_rl` are appended to `batches`."""
    from toolpolicy.trainer import rl

    original = rl.sample_groups

    def recording(*args: Any, **kwargs: Any) -> Any:
        rollouts = original(*args, **kwargs)
        batches.append(rollouts.trajectories)
        return rollouts

    rl.sample_groups = recording
    try:
        yield
    finally:
        rl.sample_groups = original


def run_toolpolicy(work: Workload, out_dir: Path) -> tuple[list[StepRecord], dict[str, Any]]:
    """`toolpolicy train` on the workload, exactly as the CLI runs it; its metrics.jsonl read back."""
    from toolpolicy.build import prepare_run_dir
    from toolpolicy.trainer.rl import train_rl

    cfg = toolpolicy_config(work, out_dir)
    batches: list[list[Trajectory]] = []
    with recorded_rollouts(batches):
        train_rl(cfg, prepare_run_dir(cfg))
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [row for row in rows if row.get("phase") == "rl"]
    if len(rows) != work.total_steps or len(batches) != work.total_steps:
        raise RuntimeError(
            f"expected {work.total_steps} RL steps, got {len(rows)} metrics rows and {len(batches)} recorded rollouts "
            "(did toolpolicy.trainer.rl.sample_groups or the metrics' names change?)"
        )
    steps = [StepRecord(row["time/step"], row["time/rollout"], **trajectory_counts(b)) for row, b in zip(rows, batches)]
    prompt_ids = [[t.token_ids[: t.prompt_len] for t in batch] for batch in batches]
    extra = {"threads_after": torch.get_num_threads(), "trainable_params": rows[-1]["trainable_params"]}
    return steps, {**extra, "prompt_ids": prompt_ids}


# --- TRL -------------------------------------------------------------------------------------


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Arithmetic with numbers, + - * / // % ** and parentheses, e.g. "12*(3+4)".
    """
    from toolpolicy.tools.calculator import evaluate, format_number
    from toolpolicy.tools.decorator import ToolError

    # toolpolicy's calculator as a plain function (TRL derives its schema from the hints and
    # docstring, which match toolpolicy's, so the prompts are identical), refusing as ToolSet does.
    try:
        return format_number(evaluate(expression))
    except ToolError as error:
        return f"Error: {error}"


def template_shows_tools(checkpoint: str) -> bool:
    """Whether the checkpoint's own chat template, as `tokenizer.apply_chat_template` renders
    it (TRL's tool loop does), shows the model a tool: the prompt changes when one is given."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    opening = [{"role": "user", "content": "Hi."}]

    def prompt(tools: list[Callable[..., str]] | None) -> str:
        return tokenizer.apply_chat_template(opening, tools=tools, add_generation_prompt=True, tokenize=False)

    return prompt([calculator]) != prompt(None)


def trl_dataset_rows(work: Workload, tokenizer: PreTrainedTokenizerBase) -> list[dict[str, Any]]:
    """The same tasks toolpolicy draws, in the same order: step k's tasks are rows
    k*prompts .. (k+1)*prompts. Multi-turn rows are conversations (TRL renders them with the
    tool); single-turn rows are toolpolicy's own rendering of the prompt as text (its template
    for `chat_tools`, with the same tools block), so TRL runs no tool loop."""
    from toolpolicy.envs import make_env
    from toolpolicy.model import ChatChoice, chat_template
    from toolpolicy.trainer.groups import train_seed

    env = make_env("calc")
    template = chat_template(tokenizer, ChatChoice(tools=work.chat_tools))
    rows = []
    for step in range(work.total_steps):
        for task in env.tasks("train", work.prompts, seed=train_seed(work.seed, step)):
            opening = env.initial_messages(task)
            prompt: Any = [{"role": m.role, "content": m.content} for m in opening]
            if work.max_turns == 1:
                prompt = template.render_prompt(opening, env.task_specs(task))
            rows.append({"prompt": prompt, "answer": task.answer, "min_tool_calls": task.info["min_tool_calls"]})
    return rows


def episode_counts(messages: list[dict[str, Any]], answer: str) -> dict[str, int]:
    """One TRL episode's turns, tool calls and correctness, from the messages it produced."""
    from toolpolicy.rewards.functions import answers_match, extract_answer

    final = messages[-1]
    answered = final["role"] == "assistant" and not final.get("tool_calls")
    value = extract_answer(final.get("content") or "") if answered else None
    return {
        "assistant_turns": sum(m["role"] == "assistant" for m in messages),
        "tool_calls": sum(m["role"] == "tool" for m in messages),
        "correct": int(value is not None and answers_match(value, answer)),
    }


def recorded_calc_reward(episodes: list[dict[str, int]]) -> Callable[..., list[float]]:
    """calc's reward for TRL (correct answer 1, each call beyond the fewest needed -0.5),
    recording each generation batch's counts into `episodes`. TRL logs it by its name."""

    def calc_reward(completions: list[Any], answer: list[str], min_tool_calls: list[int], **_: Any) -> list[float]:
        rewards = []
        batch: dict[str, int] = {"assistant_turns": 0, "tool_calls": 0, "correct": 0}
        for completion, reference, fewest in zip(completions, answer, min_tool_calls):
            messages = completion if isinstance(completion, list) else [{"role": "assistant", "content": completion}]
            counts = episode_counts(messages, reference)
            rewards.append(counts["correct"] - EXCESS_CALL_PENALTY * max(0, counts["tool_calls"] - fewest))
            batch = {key: batch[key] + counts[key] for key in batch}
        episodes.append(batch)
        return rewards

    return calc_reward


def trl_config(work: Workload, out_dir: Path) -> GRPOConfig:
    """GRPOConfig doing toolpolicy's step: one generation batch of prompts x group_size is one
    optimizer step (steps_per_generation = gradient_accumulation_steps, num_iterations 1),
    in micro-batches of micro_batch; DAPO's token-mean loss (TRL's loss_type="dapo"), clip
    0.2/0.28, beta 0 (no reference model); AdamW at a constant lr with betas (0.9, 0.99);
    the workload's dtype on the CPU without gradient checkpointing (TRL defaults to bf16 and
    checkpointing). The model loads in float32 (TRL's default), a LoRA model's in the compute
    dtype: toolpolicy stores the frozen base in it, and peft keeps the adapter in float32."""
    from trl import GRPOConfig

    if work.episodes % work.micro_batch:
        raise ValueError(f"prompts x group_size ({work.episodes}) must be a multiple of micro_batch ({work.micro_batch})")
    accumulation = work.episodes // work.micro_batch
    return GRPOConfig(
        output_dir=str(out_dir), seed=work.seed, use_cpu=True, bf16=work.dtype == "bfloat16", gradient_checkpointing=False,
        model_init_kwargs={"dtype": work.dtype if work.lora_rank else "float32"},
        max_steps=work.total_steps, per_device_train_batch_size=work.micro_batch,
        gradient_accumulation_steps=accumulation, steps_per_generation=accumulation, num_iterations=1,
        num_generations=work.group_size, shuffle_dataset=False,
        temperature=work.temperature, top_p=1.0, top_k=0, max_completion_length=work.max_completion_tokens,
        max_tool_calling_iterations=work.max_turns - 1,
        loss_type="dapo", scale_rewards="group", beta=0.0, epsilon=0.2, epsilon_high=0.28,
        learning_rate=work.lr, lr_scheduler_type="constant", optim="adamw_torch",
        adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
        logging_steps=1, save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
    )


@dataclass
class TrlRollout:
    """One generation batch as TRL hands it to the loss."""

    seconds: float
    episodes: int
    sampled_tokens: int
    prompt_ids: list[list[int]]


def timed_generation(trainer: GRPOTrainer, rollouts: list[TrlRollout]) -> None:
    """Wrap the trainer's `_generate_and_score_completions` to time it and count what it sampled."""
    generate = trainer._generate_and_score_completions

    def timed(inputs: Any) -> dict[str, Any]:
        began = time.perf_counter()
        batch = generate(inputs)
        mask = batch["completion_mask"] * batch.get("tool_mask", 1)  # [B, T] 1 on sampled tokens
        prompts = [ids[keep.bool()].tolist() for ids, keep in zip(batch["prompt_ids"], batch["prompt_mask"])]
        rollouts.append(TrlRollout(time.perf_counter() - began, len(prompts), int(mask.sum()), prompts))
        return batch

    trainer._generate_and_score_completions = timed


def step_clock(seconds: list[float]) -> TrainerCallback:
    """A callback that appends each optimizer step's wall time (on_step_begin to on_step_end)."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        began = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.began = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            seconds.append(time.perf_counter() - self.began)

    return StepClock()


def calc_tokenizer(checkpoint: str, with_tools: bool) -> PreTrainedTokenizerBase:
    """The checkpoint's tokenizer as GRPOTrainer needs it: left padding and, for tool calling,
    a response template. calc-sft's template is ChatML with Hermes `<tool_call>` JSON, Qwen's
    syntax, but TRL's `add_response_schema` recognises templates only by their exact text, so
    Qwen's response template is set here (the trainer keeps one that is already set)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.padding_side = "left"
    if with_tools:
        tokenizer.response_template = qwen3_template
    return tokenizer


def lora_config(work: Workload) -> LoraConfig | None:
    """TRL's `peft_config`: the workload's rank and alpha on toolpolicy's default target modules
    with its default dropout, as toolpolicy's `attach_lora` builds it; None without LoRA."""
    if not work.lora_rank:
        return None
    from peft import LoraConfig
    from toolpolicy.config import ModelSection

    fields = ModelSection.model_fields
    dropout, targets = (fields[name].get_default(call_default_factory=True) for name in ("lora_dropout", "lora_target_modules"))
    return LoraConfig(
        r=work.lora_rank, lora_alpha=work.lora_alpha, lora_dropout=dropout, target_modules=list(targets), task_type="CAUSAL_LM"
    )


def run_trl(work: Workload, out_dir: Path) -> tuple[list[StepRecord], dict[str, Any]]:
    """TRL's GRPOTrainer on the workload: multi-turn through its own tool loop (`tools=`)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    multi_turn = work.max_turns > 1
    tokenizer = calc_tokenizer(work.checkpoint, multi_turn)
    episodes: list[dict[str, int]] = []
    rollouts: list[TrlRollout] = []
    seconds: list[float] = []
    trainer = GRPOTrainer(
        model=work.checkpoint,
        reward_funcs=[recorded_calc_reward(episodes)],
        args=trl_config(work, out_dir),
        train_dataset=Dataset.from_list(trl_dataset_rows(work, tokenizer)),
        processing_class=tokenizer,
        tools=[calculator] if multi_turn else None,
        callbacks=[step_clock(seconds)],
        peft_config=lora_config(work),
    )
    timed_generation(trainer, rollouts)
    trainer.train()
    if not len(seconds) == len(rollouts) == len(episodes) == work.total_steps:
        raise RuntimeError(f"expected {work.total_steps} TRL steps, got {len(seconds)} / {len(rollouts)} / {len(episodes)}")
    steps = [
        StepRecord(took, rollout.seconds, rollout.episodes, rollout.sampled_tokens, malformed_calls=0, **counts)
        for took, rollout, counts in zip(seconds, rollouts, episodes)
    ]
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    extra = {"threads_after": torch.get_num_threads(), "trainable_params": trainable}
    return steps, {**extra, "prompt_ids": [r.prompt_ids for r in rollouts]}


RUNNERS: dict[str, Callable[[Workload, Path], tuple[list[StepRecord], dict[str, Any]]]] = {
    "toolpolicy": run_toolpolicy,
    "trl": run_trl,
}


def main() -> None:
    side, workload_file, out_file = sys.argv[1:]
    work = Workload(**json.loads(Path(workload_file).read_text()))
    torch.set_num_threads(work.threads)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    out = Path(out_file)
    run_dir = out.parent / f"{out.stem}-run"
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, never a resumed one
    steps, extra = RUNNERS[side](work, run_dir)
    write_result(out, {"side": side, "steps": [asdict(s) for s in steps], **extra}, indent=1)


if __name__ == "__main__":
    main()
