"""SFT cold start: next-token loss on the assistant tokens of demonstration episodes.

Demonstrations are replayed through the rollout engine (`demonstrations.py`),
so SFT trains on exactly the token framing RL will sample in, and the loss mask
is the engine's: assistant tokens only, never the prompt or tool output.
Conversations from a file (`sft_data`, `sft_data.py`) are cut into the same
fragments, with the same mask.

    toolpolicy sft CONFIG [--set key=value ...]
    toolpolicy sft --resume RUN_DIR     # from its last checkpoint, with RUN_DIR/config.yaml
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from toolpolicy.algorithms import aggregate_loss
from toolpolicy.config import Config
from toolpolicy.build import trainable_policy
from toolpolicy.model.placement import device_of, memory_metrics
from toolpolicy.rollout import Trajectory
from toolpolicy.trainer.batch import collate, forward_logprobs, micro_batches
from toolpolicy.trainer.checkpoint import MetricsLog, restore_state, resume_from, save_checkpoint, save_final
from toolpolicy.trainer.demonstrations import build_embedded, sft_examples, within_prompt_budget
from toolpolicy.trainer.trackers import open_trackers


def warmup_cosine(warmup: int, total: int, floor: float = 0.1):
    """LR multiplier: linear warm-up, then cosine decay to `floor` at `total`."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> list[int]:
    """The examples of `step`: a fresh shuffle every epoch, a pure function of step (the data cursor)."""
    out = []
    for position in range(step * batch_size, (step + 1) * batch_size):
        epoch, offset = divmod(position, n)
        order = list(range(n))
        random.Random(f"sft/{seed}/{epoch}").shuffle(order)
        out.append(order[offset])
    return out


def sft_loss(
    model: torch.nn.Module, examples: list[Trajectory], pad_id: int, micro_batch_size: int, micro_batch_tokens: int | None = None
) -> float:
    """Mean negative log-likelihood per assistant token; gradients accumulate in `model`, over
    micro-batches of at most micro_batch_size rows and micro_batch_tokens positions."""
    batch = collate(sorted(examples, key=lambda t: len(t.token_ids)), pad_id)  # similar lengths share a micro-batch
    total_tokens = float(batch.loss_mask.sum())
    total = 0.0
    device = device_of(model)
    for _, piece in micro_batches(batch, micro_batch_size, micro_batch_tokens):
        piece = piece.to(device)
        logprobs, _ = forward_logprobs(model, piece)  # [b, l]
        loss = aggregate_loss(-logprobs, piece.loss_mask, "token_mean", total_tokens, len(examples))
        loss.backward()
        total += float(loss.detach())
    return total


def train_sft(cfg: Config, run_dir: Path, resume: bool = False) -> Path:
    """Run SFT and return the folder of the final model (RUN_DIR/sft/final)."""
    phase_dir = run_dir / "sft"
    base = run_dir / "model" if cfg.model.source == "embedded" else Path(cfg.model.source)
    if cfg.model.source == "embedded" and not (base / "config.json").is_file():
        build_embedded(cfg, base)
    checkpoint = resume_from(phase_dir) if resume else None
    policy = trainable_policy(cfg.model, checkpoint or base, phase_dir, resuming=checkpoint is not None)
    model = policy.model
    examples = sft_examples(cfg, cfg.sft.examples, policy.chat, policy.encode, policy.decode, "sft")
    examples = within_prompt_budget(examples, cfg.env.max_prompt_tokens)

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.sft.lr, betas=(0.9, 0.95), weight_decay=cfg.optim.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.sft.warmup_steps, cfg.sft.steps))
    start = restore_state(checkpoint, optimizer, scheduler, None).step if checkpoint else 0
    log = MetricsLog(run_dir / "metrics.jsonl", open_trackers(cfg, run_dir, "sft", start))
    log.drop_after("sft", start)

    model.train()
    bar = tqdm(range(start, cfg.sft.steps), desc="sft", initial=start, total=cfg.sft.steps)
    for step in bar:
        began = time.perf_counter()
        chosen = [examples[i] for i in batch_indices(len(examples), cfg.sft.batch_size, step, cfg.run.seed)]
        optimizer.zero_grad(set_to_none=True)
        loss = sft_loss(model, chosen, policy.pad_id, cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens)
        grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, cfg.optim.grad_clip))
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        tokens = sum(t.sampled_tokens for t in chosen)
        elapsed = time.perf_counter() - began
        record = {"phase": "sft", "step": step + 1, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens / elapsed}
        log.write({**record, "time/step": elapsed, **memory_metrics(model, optimizer)})
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        if (step + 1) % cfg.run.checkpoint_every == 0 or step + 1 == cfg.sft.steps:
            save_checkpoint(phase_dir, step + 1, model, policy.tokenizer, optimizer, scheduler, None, cfg.run.keep_checkpoints)
    log.close()
    return save_final(phase_dir, model, policy.tokenizer)
