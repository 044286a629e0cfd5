"""SFT cold start: next-token loss on the assistant tokens of demonstration episodes.

Demonstrations are replayed through the rollout engine (`demonstrations.py`),
so SFT trains on exactly the token framing RL will sample in, and the loss mask
is the engine's: assistant tokens only, never the prompt or tool output.
Conversations from a file (`sft_data`, `sft_data.py`) are cut into the same
fragments, with the same mask.

    toolpolicy sft CONFIG [--set key=value ...]
    toolpolicy sft --resume RUN_DIR     # from its last checkpoint, with RUN_DIR/config.yaml
    torchrun --nproc-per-node N -m toolpolicy sft CONFIG   # each process a share of every batch

Under torchrun each process takes a contiguous share of the step's examples, the loss
normalised by the whole batch's assistant tokens, so the summed gradient is one process's;
the processes hold the model as `model.sharing` says (trainer/distributed.py).
"""

from __future__ import annotations

import random
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from toolpolicy.algorithms import aggregate_loss
from toolpolicy.build import trainable_policy
from toolpolicy.checks import check_processes
from toolpolicy.config import Config
from toolpolicy.model.placement import device_of, memory_metrics, resolve_device
from toolpolicy.model.vision import VisionInput
from toolpolicy.rollout import Trajectory
from toolpolicy.trainer.batch import FULL_SEQUENCES, Lockstep, Recompute, collate, micro_batches, own_count, padding_passes
from toolpolicy.trainer.checkpoint import MetricsLog, restore_state, resume_from, save_checkpoint, save_final
from toolpolicy.trainer.demonstrations import build_embedded, sft_examples, within_prompt_budget
from toolpolicy.trainer.distributed import World, clip_gradients, sharing_of
from toolpolicy.trainer.schedule import warmup_cosine
from toolpolicy.trainer.trackers import open_trackers


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
    model: torch.nn.Module,
    examples: list[Trajectory],
    pad_id: int,
    micro_batch_size: int,
    micro_batch_tokens: int | None = None,
    total_tokens: float | None = None,
    recompute: Recompute = FULL_SEQUENCES,
    lockstep: Lockstep = own_count,
    vision: VisionInput | None = None,
) -> float:
    """Negative log-likelihood of the assistant tokens of `examples` over `total_tokens` (default:
    theirs, the mean per token; under torchrun the whole batch's, `examples` being this rank's
    share); gradients accumulate in `model`, over micro-batches of at most micro_batch_size rows
    and micro_batch_tokens positions. `recompute` runs the model (through its sharded root);
    `lockstep` pads this rank's passes to the other ranks' (see trainer/batch.py); `vision`
    gives the pixels of the examples' pictures (a vision-language model's)."""
    batch = collate(sorted(examples, key=lambda t: len(t.token_ids)), pad_id, vision) if examples else None  # similar lengths share a micro-batch
    pieces = micro_batches(batch, micro_batch_size, micro_batch_tokens) if batch is not None else []
    total_tokens = total_tokens if total_tokens is not None else float(batch.loss_mask.sum()) if batch is not None else 1.0
    total = 0.0
    device = device_of(model)
    padding_passes(model, None, len(pieces), lockstep, pad_id, recompute)
    for _, piece in pieces:
        piece = piece.to(device)
        logprobs, _ = recompute.logprobs(model, piece)  # [b, l]
        loss = aggregate_loss(-logprobs, piece.loss_mask, "token_mean", total_tokens, len(examples))
        loss.backward()
        total += float(loss.detach())
    return total


def train_sft(cfg: Config, run_dir: Path, resume: bool = False) -> Path:
    """Run SFT and return the folder of the final model (RUN_DIR/sft/final)."""
    check_processes(cfg, World.requested(), "sft")
    world = World.from_environment(resolve_device(cfg.model.device))
    phase_dir = run_dir / "sft"
    base = run_dir / "model" if cfg.model.source == "embedded" else Path(cfg.model.source)
    if cfg.model.source == "embedded" and not (base / "config.json").is_file() and world.main:
        build_embedded(cfg, base)
    world.barrier()  # every rank loads the model rank 0 built
    checkpoint = resume_from(phase_dir) if resume else None
    policy = trainable_policy(cfg.model, checkpoint or base, phase_dir, checkpoint is not None, cfg.run.seed, world.main, world.barrier)
    model = policy.model
    sharing = sharing_of(cfg.model, world)
    whole = sharing.place(model, world)  # the weights saved: `model`, or its shards gathered
    recompute = replace(FULL_SEQUENCES, logprobs=sharing.logprobs(FULL_SEQUENCES.logprobs))
    examples = sft_examples(cfg, cfg.sft.examples, policy.chat, policy.encode, policy.decode, "sft")
    examples = within_prompt_budget(examples, cfg.env.max_prompt_tokens)

    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=cfg.sft.lr, betas=(0.9, 0.95), weight_decay=cfg.optim.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(cfg.sft.warmup_steps, cfg.sft.steps))
    start = restore_state(checkpoint, optimizer, scheduler, None, sharing.shards(model, optimizer)).step if checkpoint else 0
    log = MetricsLog(run_dir / "metrics.jsonl", open_trackers(cfg, run_dir, "sft", start) if world.main else ())
    if world.main:
        log.drop_after("sft", start)

    model.train()
    bar = tqdm(range(start, cfg.sft.steps), desc="sft", initial=start, total=cfg.sft.steps, disable=not world.main)
    for step in bar:
        began = time.perf_counter()
        chosen = [examples[i] for i in batch_indices(len(examples), cfg.sft.batch_size, step, cfg.run.seed)]
        mine = [chosen[i] for i in world.share(len(chosen))]
        tokens = sum(t.sampled_tokens for t in chosen)
        optimizer.zero_grad(set_to_none=True)
        loss = sft_loss(
            model, mine, policy.pad_id, cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens, tokens, recompute,
            sharing.lockstep(world), policy.vision,
        )
        loss = world.reduce_stats({"loss": loss}, ())["loss"]
        sharing.reduce_gradients(trainable, world)
        grad_norm = clip_gradients(trainable, cfg.optim.grad_clip)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        scheduler.step()
        elapsed = time.perf_counter() - began
        record = {"phase": "sft", "step": step + 1, "loss": loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tokens / elapsed}
        memory = memory_metrics(model, optimizer)
        if world.main:
            log.write({**record, "time/step": elapsed, **memory})
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        if (step + 1) % cfg.run.checkpoint_every == 0 or step + 1 == cfg.sft.steps:
            sharing.refresh(model, whole)
            save_checkpoint(
                phase_dir, step + 1, whole, policy.tokenizer, optimizer, scheduler, None, cfg.run.keep_checkpoints,
                world=world, shards=sharing.shards(model, optimizer),
            )
            world.barrier()  # no rank runs ahead of a checkpoint it may resume from
    log.close()
    sharing.refresh(model, whole)  # the last checkpoint gathered them already, unless the run was resumed at its end
    final = save_final(phase_dir, whole, policy.tokenizer) if world.main else phase_dir / "final"
    world.barrier()
    world.close()
    return final
