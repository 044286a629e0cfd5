"""RL on a tool environment with the GRPO family, in one loop you can read top to bottom.

Each step: sample `prompts_per_step` tasks (a pure function of the step: the data
cursor), roll out `group_size` episodes per task with the multi-turn engine,
score them with the environment's Rubric, turn rewards into advantages, drop
groups with no signal (DAPO dynamic sampling, refilled up to max_refill_rounds)
and filtered episodes, and take one policy-gradient step on the sampled tokens.

Which estimator, ratio level, aggregation, KL estimator and filters run is the
config's (`algorithm:` presets, or each knob; see toolpolicy.algorithms); the
choice is made once, outside the loop (trainer/credit.py, POLICY_LOSSES,
KL_ESTIMATORS). Relative to the papers this simplifies: one optimizer step per
rollout batch (so the old policy is the rollout policy and its log-probabilities
are the rollout's own, recorded at sampling time); no value model. Token ids stay
exactly as sampled and tool output is masked out of the loss.

    toolpolicy train CONFIG [--set key=value ...] [--resume RUN_DIR]
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from tqdm.auto import tqdm

from toolpolicy.algorithms import KL_ESTIMATORS, POLICY_LOSSES, aggregate_loss, first_groups, varied_groups
from toolpolicy.model import load_policy
from toolpolicy.rewards import REWARD_FUNCTIONS, RewardFunction, Rubric, Score, policy_violation
from toolpolicy.rollout import RolloutEngine, Trajectory
from toolpolicy.trainer.batch import TokenBatch, collate, forward_logprobs, micro_batches
from toolpolicy.trainer.checkpoint import MetricsLog, latest_checkpoint, restore_state, save_checkpoint, save_final
from toolpolicy.trainer.config import Config, ConfigError
from toolpolicy.trainer.credit import Credit, step_rewards, update_mask
from toolpolicy.trainer.setup import make_engine, wrap_policy

REFILL_SEED_STRIDE = 100_000_007  # refill rounds draw tasks far from every step's own seed


def train_seed(seed: int, step: int, refill: int = 0) -> int:
    """Seed of the training tasks of `step` (and of its refill round); evaluation uses its own split and seed."""
    return seed * 1_000_003 + step + refill * REFILL_SEED_STRIDE


def sample_groups(
    engine: RolloutEngine, rubric: Rubric, cfg: Config, step: int
) -> tuple[list[Trajectory], list[Score], torch.Tensor, torch.Tensor, int]:
    """Roll out group_size episodes per task and score them. With dynamic sampling, draw
    more tasks while fewer than prompts_per_step groups have varied rewards (DAPO's refill,
    at most max_refill_rounds rounds), then keep the first prompts_per_step of those.
    Returns trajectories, scores, their rewards [B] (see step_rewards), the kept-group
    mask [G] and the refill rounds used."""
    size = cfg.group_size
    trajectories: list[Trajectory] = []
    scores: list[Score] = []
    for refill in range(cfg.max_refill_rounds + 1):
        tasks = engine.env.tasks("train", cfg.prompts_per_step, seed=train_seed(cfg.seed, step, refill))
        batch = engine.run([task for task in tasks for _ in range(size)])
        trajectories += batch
        scores += [rubric.score(t.episode) for t in batch]
        usable = torch.tensor([t.episode.infra_error is None for t in trajectories])  # [B]
        rewards = step_rewards(trajectories, scores, usable, cfg)  # [B]
        groups = varied_groups(rewards, size) if cfg.dynamic_sampling else torch.ones(len(trajectories) // size, dtype=torch.bool)
        if not cfg.dynamic_sampling or int(groups.sum()) >= cfg.prompts_per_step:
            break
    return trajectories, scores, rewards, first_groups(groups, cfg.prompts_per_step), refill


def policy_update(
    model: torch.nn.Module,
    reference: torch.nn.Module | None,
    batch: TokenBatch,
    advantages: torch.Tensor,
    cfg: Config,
) -> dict[str, float]:
    """Accumulate the policy-loss (+ beta * KL) gradient over micro-batches. Returns detached stats.

    advantages: [B] per episode, or [B, L-1] per token (turn credit), cut to each piece's width.
    The ratio level, KL estimator and aggregation are the config's (see toolpolicy.algorithms)."""
    policy_loss = POLICY_LOSSES[cfg.ratio_level]
    kl_estimator = KL_ESTIMATORS[cfg.kl_estimator]
    total_tokens = float(batch.loss_mask.sum())
    total_sequences = float(batch.input_ids.shape[0])
    sums: dict[str, float] = defaultdict(float)
    for rows, piece in micro_batches(batch, cfg.micro_batch_size):
        logprobs, entropy = forward_logprobs(model, piece, cfg.temperature, with_entropy=True)  # [b, l]
        piece_advantages = advantages[rows] if advantages.dim() == 1 else advantages[rows, : logprobs.shape[1]]
        per_token, stats = policy_loss(
            logprobs, piece.old_logprobs, piece_advantages, cfg.clip_low, cfg.clip_high,
            loss_mask=piece.loss_mask, dual_clip=cfg.dual_clip,
        )
        if reference is not None:
            with torch.no_grad():
                ref_logprobs, _ = forward_logprobs(reference, piece, cfg.temperature)  # [b, l]
            kl = kl_estimator(logprobs, ref_logprobs)  # [b, l]
            if cfg.beta > 0:
                per_token = per_token + cfg.beta * kl
            sums["kl"] += float((kl.detach() * piece.loss_mask).sum())
        loss = aggregate_loss(
            per_token, piece.loss_mask, cfg.aggregation, total_tokens, total_sequences, norm_length=cfg.max_tokens
        )
        loss.backward()
        weight = float(piece.loss_mask.sum())
        sums["loss"] += float(loss.detach())
        sums["entropy"] += float((entropy * piece.loss_mask).sum())
        sums["clip_frac"] += stats["clip_fraction"] * weight
        sums["ratio"] += stats["ratio_mean"] * weight
    out = {"loss": sums["loss"]}
    for key in ("entropy", "clip_frac", "ratio") + (("kl",) if reference is not None else ()):
        out[key] = sums[key] / max(total_tokens, 1.0)
    return out


def rollout_metrics(trajectories: list[Trajectory], scores: list[Score], success: RewardFunction) -> dict[str, float]:
    """Per-step means of reward, accuracy (the share with `success` 1, as in evaluation),
    tool use and policy violations, overall and per difficulty."""
    out: dict[str, float] = {}
    by_difficulty: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        by_difficulty[t.episode.task.difficulty].append(i)
    n = len(trajectories)
    solved = [success(t.episode) == 1.0 for t in trajectories]
    calls = sum(t.episode.count("tool_call") for t in trajectories)
    invalid = sum(t.episode.count("invalid_call") for t in trajectories)
    out["reward"] = sum(s.total for s in scores) / n
    out["accuracy"] = sum(solved) / n
    out["tool_calls"] = calls / n
    out["invalid_call_rate"] = invalid / max(1, calls + invalid)
    out["truncated_rate"] = sum(t.episode.truncated for t in trajectories) / n
    out["infra_errors"] = sum(t.episode.infra_error is not None for t in trajectories)
    out["response_tokens"] = sum(t.response_len for t in trajectories) / n
    out["denials"] = sum(t.episode.count("gate_deny") for t in trajectories) / n
    out["violations"] = sum(policy_violation(t.episode) for t in trajectories) / n
    by_rule: Counter[str] = Counter()
    for t in trajectories:
        by_rule.update(t.episode.denials_by_rule())
    for rule, count in sorted(by_rule.items()):
        out[f"denials/{rule}"] = count / n
    for difficulty, rows in sorted(by_difficulty.items()):
        out[f"accuracy/{difficulty}"] = sum(solved[i] for i in rows) / len(rows)
        out[f"tool_calls/{difficulty}"] = sum(trajectories[i].episode.count("tool_call") for i in rows) / len(rows)
    return out


def train_rl(cfg: Config, run_dir: Path, resume: bool = False) -> Path:
    """Run RL from `cfg.init_from` and return the folder of the final model (RUN_DIR/rl/final)."""
    if not cfg.init_from:
        raise ConfigError("init_from is empty: set it to the checkpoint RL starts from (for example RUN_DIR/sft/final)")
    phase_dir = run_dir / "rl"
    checkpoint = latest_checkpoint(phase_dir) if resume else None
    policy = wrap_policy(*load_policy(checkpoint or cfg.init_from))
    model = policy.model
    reference = load_policy(cfg.init_from)[0].eval() if (cfg.beta > 0 or cfg.log_kl) else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.rl_lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    warmup = max(1, cfg.rl_warmup_steps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))
    sampler = torch.Generator().manual_seed(cfg.seed)
    start = restore_state(checkpoint, optimizer, scheduler, sampler) if checkpoint else 0
    engine = make_engine(cfg, policy, sampler)
    rubric = Rubric.from_weights(cfg.rewards or engine.env.default_rewards)
    success = REWARD_FUNCTIONS[engine.env.success_reward]
    credit = Credit(cfg, rubric)
    log = MetricsLog(run_dir / "metrics.jsonl")
    log.rewind("rl", start)

    with engine:  # closes the gate's audit log, if any, when RL ends
        for step in tqdm(range(start, cfg.rl_steps), desc="rl", initial=start, total=cfg.rl_steps):
            began = time.perf_counter()
            # 1. Rollout: group_size episodes per task, contiguous; refilled if too few groups vary.
            trajectories, scores, rewards, groups, refills = sample_groups(engine, rubric, cfg, step)
            rollout_time = time.perf_counter() - began

            # 2. Rewards -> advantages (per episode, or per token with turn credit); the filters.
            usable = torch.tensor([t.episode.infra_error is None for t in trajectories])  # [B]
            advantages = credit(trajectories, scores, rewards, usable)  # [B], or [B, L-1] with turn credit
            keep = update_mask(trajectories, groups, usable, cfg)  # [B]

            # 3. One policy-gradient step on the kept episodes' sampled tokens.
            model.train()
            optimizer.zero_grad(set_to_none=True)
            # Kept episodes sorted by length, so micro-batches carry little padding.
            order = sorted(torch.nonzero(keep).flatten().tolist(), key=lambda i: len(trajectories[i].token_ids))
            update: dict[str, float] = {}
            grad_norm = 0.0
            if order:
                chosen = collate([trajectories[i] for i in order], policy.pad_id)
                update = policy_update(model, reference, chosen, advantages[order], cfg)
                grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
                optimizer.step()
            lr = scheduler.get_last_lr()[0]
            scheduler.step()

            # 4. Log and checkpoint.
            record = {"phase": "rl", "step": step + 1, **rollout_metrics(trajectories, scores, success), **update}
            record.update({"kept_groups": int(groups.sum()), "refill_rounds": refills, "grad_norm": grad_norm, "lr": lr})
            record.update({"time/rollout": rollout_time, "time/step": time.perf_counter() - began})
            log.write(record)
            if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.rl_steps:
                save_checkpoint(phase_dir, step + 1, model, policy.tokenizer, optimizer, scheduler, sampler, cfg.keep_checkpoints)

    return save_final(phase_dir, model, policy.tokenizer)
