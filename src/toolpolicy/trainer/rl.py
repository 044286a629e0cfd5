"""RL on a tool environment with the GRPO family, in one loop you can read top to bottom.

Each step: sample `rl.prompts_per_step` tasks (a pure function of the step: the data
cursor), roll out `rl.group_size` episodes per task with the multi-turn engine, score
them with the environment's Rubric into a reward matrix [B, C], turn it into
advantages, keep the groups that carry a signal for the estimator (DAPO dynamic
sampling, refilled up to algorithm.max_refill_rounds) and the episodes the filters keep,
and take policy-gradient steps on the sampled tokens: `algorithm.update_passes` passes
over them, each cut into `algorithm.mini_batches` optimizer steps on runs of whole groups
(one step by default; `train_on_batch`). With `algorithm.branch`, up to
`algorithm.branch_groups` more groups continue the step's episodes from inside them (after an
error, or where the policy is most uncertain after a tool result; `branch_groups`,
trainer/branching.py). A run in which no group carries a signal for
`rl.max_idle_steps` steps in a row has nothing to learn from and stops (TrainingStalled).

The objective (estimator, ratio level, KL estimator, aggregation), the credit
(outcome or turn) and the filters are chosen once, before the loop, from the
config's `algorithm` section (a preset, or each field; see toolpolicy.algorithms). The old
policy is the rollout policy: its log-probabilities are the rollout's own, recorded at
sampling time (with TIS, the trainer's under the sampling weights, taken before the
first step when there are several). With one optimizer step per batch the ratio is 1
on every token and clipping never acts; every later step of the batch trains a policy
that has moved. No value model.
Token ids stay exactly as sampled and tool output is masked out of the loss.

The step's parts live beside this file: the groups it samples (groups.py), the update on
them (update.py), the figures it logs (step_metrics.py).

    toolpolicy train CONFIG [--set section.field=value ...]
    toolpolicy train --resume RUN_DIR     # from its last checkpoint, with RUN_DIR/config.yaml
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm

from toolpolicy.algorithms.distill import DIVERGENCES
from toolpolicy.build import (
    build_rubric,
    load_policy_model,
    planned_optimizer_steps,
    trainable_policy,
)
from toolpolicy.checks import check_processes, require_init_from
from toolpolicy.config import Config
from toolpolicy.model import PolicyModel
from toolpolicy.model.placement import memory_metrics, resolve_device
from toolpolicy.rewards import RewardFunction, Rubric, reward_function
from toolpolicy.rollout import Trajectory
from toolpolicy.rollout.catalog import capabilities_of
from toolpolicy.rollout.store import drop_steps_after, step_table, write_step
from toolpolicy.trainer.batch import FULL_SEQUENCES, SHARED_PROMPTS
from toolpolicy.trainer.branching import PICKERS, Picker
from toolpolicy.trainer.checkpoint import (
    MetricsLog,
    Restored,
    restore_state,
    resume_from,
    save_checkpoint,
    save_final,
)
from toolpolicy.trainer.credit import Credit, EpisodeFilter, update_mask
from toolpolicy.trainer.distributed import World, sharing_of
from toolpolicy.trainer.groups import (
    Sampling,
    branch_groups,
    check_dropped,
    prompt_fits,
    sample_groups,
    submit_round,
    task_pool,
)
from toolpolicy.trainer.replay import SuccessReplay
from toolpolicy.trainer.rollouts import (
    LocalRollouts,
    Pending,
    RayRollouts,
    Rollouts,
    open_engine,
    save_start,
    saved_start,
)
from toolpolicy.trainer.schedule import rl_schedule
from toolpolicy.trainer.step_metrics import progress_line, step_record, step_records
from toolpolicy.trainer.teacher import (
    Distill,
    DistilledCredit,
    FullTeacher,
    Teacher,
    same_vocabulary,
)
from toolpolicy.trainer.trackers import open_trackers
from toolpolicy.trainer.update import (
    UPDATE_MAXIMA,
    Learner,
    UpdateSettings,
    algorithm_of,
    correction_of,
    train_on_batch,
    update_metrics,
)


class TrainingStalled(Exception):
    """RL that has had nothing to learn from for max_idle_steps steps in a row."""


def train_rl(cfg: Config, run_dir: Path, resume: bool = False) -> Path:
    """Run RL from `rl.init_from` and return the folder of the final model (RUN_DIR/rl/final)."""
    run = open_run(cfg, run_dir, resume)
    rl, learner, pool, world = cfg.rl, run.parts.learner, run.pool, run.world
    idle_steps = 0  # steps in a row whose kept groups carried no signal
    ahead: deque[tuple[int, Pending]] = deque()  # submitted first rounds of the next steps, with their weights' version
    updates = run.start  # rollout batches the trainer's weights have been updated on (a resumed run's samplers load them)
    try:
        steps = tqdm(range(run.start, rl.steps), desc="rl", initial=run.start, total=rl.steps, disable=not world.main)
        counted = pool.counts()  # token positions the samplers ran before this step (one gather per step)
        for step in steps:
            began = time.perf_counter()
            # 1. Rollout: group_size episodes per task, contiguous, scored; refilled if too few groups carry a signal.
            # Async (max_staleness k): the first rounds of steps up to step + k are already being sampled.
            while len(ahead) <= rl.max_staleness and step + len(ahead) < rl.steps:
                ahead.append((updates, submit_round(pool, run.sampling, step + len(ahead), 0)))
            version, first = ahead.popleft()
            staleness = updates - version  # batches' updates the first round's sampler had not seen
            sampled = sample_groups(pool, run.rubric, run.parts.credit, run.sampling, step, first, run.replay)
            if run.pick is not None:
                sampled = branch_groups(pool, run.rubric, run.parts.credit, run.sampling, step, sampled, run.pick, cfg.algorithm.branch_groups)
            trajectories = sampled.trajectories
            rollout_time = time.perf_counter() - began
            check_dropped(trajectories, step, world.main)

            # 2. Rewards -> advantages (per episode, or per token with turn credit); the filters.
            advantages = run.parts.credit.advantages(trajectories, sampled.rewards, sampled.weights, rl.group_size, sampled.groups)  # [B] or [B, L-1]
            keep = update_mask(trajectories, sampled.groups, sampled.usable, rl.group_size, run.parts.filters)  # [B]

            # 3. Policy-gradient steps on the kept episodes' sampled tokens: update_passes passes over
            # them, each cut into mini_batches optimizer steps on runs of whole groups.
            # Kept episodes group by group, by length within a group (this rank's share is whole groups;
            # update_order then picks the micro-batch layout that runs the fewest positions).
            order = sorted(torch.nonzero(keep).flatten().tolist(), key=lambda i: (i // rl.group_size, len(trajectories[i].token_ids)))
            lr = learner.scheduler.get_last_lr()[0]  # the LR of the step's first optimizer step
            stepped = update_step(run, trajectories, order, advantages) if order else StepUpdate({}, [], {})
            updates += bool(order)

            # 4. Log and checkpoint.
            record = step_record(
                step + 1, sampled, run.success, rl.group_size, len(order), stepped.metrics, stepped.grad_norms, lr, staleness,
                run.pick is not None, run.replay is not None,
            )
            if run.parts.teacher is not None:
                record.update({"distill/reverse_kl": run.parts.teacher.reverse_kl, "tokens/teacher": run.parts.teacher.tokens})
            if run.store is not None:
                stored = time.perf_counter()
                records = step_records(sampled, advantages, keep, stepped.recomputed, run.success)
                write_step(run.store, step + 1, step_table(step + 1, rl.group_size, staleness, records))
                record["time/store"] = time.perf_counter() - stored
            record.update({"time/rollout": rollout_time, "time/step": time.perf_counter() - began})
            now = pool.counts()
            record.update({f"tokens/{kind}": n for kind, n in (now - counted).items()})
            counted = now
            record.update(memory_metrics(learner.model, learner.optimizer))
            if world.main:
                run.log.write(record)
                steps.set_postfix(progress_line(record), refresh=False)
            if (step + 1) % cfg.run.checkpoint_every == 0 or step + 1 == rl.steps:
                checkpoint(run, step + 1, cfg.run.keep_checkpoints)

            # 5. Stop a run that has nothing to learn from: every group's episodes scored alike, step after step.
            idle_steps = 0 if record["signal_groups"] else idle_steps + 1
            if rl.max_idle_steps and idle_steps >= rl.max_idle_steps:
                raise TrainingStalled(stalled_message(cfg, idle_steps))
    finally:
        pool.close()  # the audit logs, and Ray's workers
        run.log.close()

    learner.sharing.refresh(learner.model, run.parts.whole)  # gathered already, unless the run was resumed at its end
    final = save_final(run.phase_dir, run.parts.whole, run.parts.policy.tokenizer) if world.main else run.phase_dir / "final"
    world.barrier()
    world.close()
    return final


class StepUpdate(NamedTuple):
    """What a step's update gives the log: its metrics (update.update_metrics, every rank's),
    each optimizer step's gradient norm, and the trainer's log-probs of each trained episode
    (gathered from every rank when the rollout store keeps them)."""

    metrics: dict[str, float]
    grad_norms: list[float]
    recomputed: dict[int, list[float]]


def update_step(run: Run, trajectories: list[Trajectory], order: list[int], advantages: torch.Tensor) -> StepUpdate:
    """The optimizer steps on the kept episodes `order`, then the samplers' weights brought up to them."""
    learner = run.parts.learner
    done = train_on_batch(learner, trajectories, order, advantages)
    recomputed = dict(run.world.gather(list(done.recomputed.items()))) if run.cfg.rl.store_rollouts else done.recomputed  # every rank gathers
    sums = run.world.reduce_stats(done.sums, UPDATE_MAXIMA)
    metrics = update_metrics(sums, len(done.grad_norms), learner.reference is not None, learner.distill)
    learner.sharing.refresh(learner.model, run.parts.whole)
    run.pool.sync(run.parts.whole)  # a sampler with its own copy of the weights gets the new ones
    return StepUpdate(metrics, done.grad_norms, recomputed)


def checkpoint(run: Run, step: int, keep: int) -> None:
    """Save step `step`'s checkpoint (every rank's share of it), then wait for every rank: none
    runs ahead of a checkpoint it may resume from."""
    learner = run.parts.learner
    save_checkpoint(
        run.phase_dir, step, run.parts.whole, run.parts.policy.tokenizer, learner.optimizer, learner.scheduler, run.generator, keep,
        rollouts=run.pool.state(), world=run.world, shards=learner.sharing.shards(learner.model, learner.optimizer),
        replay=run.replay.state() if run.replay is not None else None,
    )
    run.world.barrier()


class Run(NamedTuple):
    """Everything the step loop reads, built once by `open_run`."""

    cfg: Config
    phase_dir: Path
    world: World
    parts: LearnerParts
    generator: torch.Generator
    """The batch's sampling stream (rl.sampling_streams: batch), saved with each checkpoint."""
    start: int
    """The last step done: 0, or the resumed checkpoint's."""
    log: MetricsLog
    store: Path | None
    """The rollout store's folder (rl.store_rollouts, on the main rank), else None."""
    pool: Rollouts
    rubric: Rubric
    sampling: Sampling
    success: RewardFunction
    replay: SuccessReplay | None
    pick: Picker | None
    """Where episodes branch (algorithm.branch), or None."""


def open_run(cfg: Config, run_dir: Path, resume: bool) -> Run:
    """The learner, restored from the last checkpoint on a resume, the metrics log and rollout
    store cut back to where it was, the rollouts and what each step draws."""
    rl = require_init_from(cfg).rl
    check_processes(cfg, World.requested())
    phase_dir = run_dir / "rl"
    last = resume_from(phase_dir) if resume else None
    world = World.from_environment(resolve_device(cfg.model.device))
    parts = open_learner(cfg, world, last, phase_dir)
    learner = parts.learner
    generator = torch.Generator().manual_seed(cfg.run.seed)
    restored = (
        restore_state(last, learner.optimizer, learner.scheduler, generator, learner.sharing.shards(learner.model, learner.optimizer))
        if last else Restored(0, saved_start(phase_dir) if resume else {})
    )
    learner.sharing.refresh(learner.model, parts.whole)  # the sampler's weights, after the optimizer took its parameters and a resume its state
    log = MetricsLog(run_dir / "metrics.jsonl", open_trackers(cfg, run_dir, "rl", restored.step) if world.main else ())
    if world.main:
        log.drop_after("rl", restored.step)
        drop_steps_after(phase_dir / "rollouts", restored.step)
    pool, rubric = open_rollouts(cfg, parts, generator, run_dir, last, restored)
    if not resume:  # where a run killed before its first checkpoint takes its audit logs back to
        start_state = pool.state()
        if world.main:
            save_start(phase_dir, start_state)
    success = reward_function(pool.env.success_reward)
    replay = SuccessReplay(lambda episode: success(episode) == 1.0) if cfg.algorithm.replay else None
    if replay is not None:
        replay.restore(restored.replay)
    store = phase_dir / "rollouts" if rl.store_rollouts and world.main else None
    return Run(
        cfg, phase_dir, world, parts, generator, restored.step, log, store, pool, rubric, step_sampling(cfg, pool, parts.policy),
        success, replay, PICKERS.get(cfg.algorithm.branch),
    )


class LearnerParts(NamedTuple):
    """What `open_learner` builds: the policy and the learner that steps it, the weights that
    sample and are saved (`whole`: the model, or its shards gathered), and the credit, the
    episode filters and the scoring teacher chosen from the algorithm section."""

    policy: PolicyModel
    learner: Learner
    whole: torch.nn.Module
    credit: Credit
    filters: tuple[EpisodeFilter, ...]
    teacher: Teacher | None


def open_learner(cfg: Config, world: World, checkpoint: Path | None, phase_dir: Path) -> LearnerParts:
    """The policy from `checkpoint` (a resume) or rl.init_from, placed as model.sharing says,
    its KL reference, its teacher, optimizer and LR schedule, and the objective chosen once."""
    rl = cfg.rl
    algorithm, credit, filters = algorithm_of(cfg.algorithm)
    correction = correction_of(cfg.algorithm, capabilities_of(cfg.backend))
    # Each distinct prompt once, unless gradient checkpointing (no KV cache to share then) or a
    # teacher in the loss (its KL comes with a forward over whole sequences) says otherwise.
    teacher_in_loss = bool(cfg.algorithm.teacher) and cfg.algorithm.teacher_loss in DIVERGENCES
    recompute = FULL_SEQUENCES if cfg.model.gradient_checkpointing or teacher_in_loss else SHARED_PROMPTS
    policy = trainable_policy(cfg.model, checkpoint or rl.init_from, phase_dir, checkpoint is not None, cfg.run.seed, world.main, world.barrier)
    model = policy.model
    sharing = sharing_of(cfg.model, world)
    whole = sharing.place(model, world)
    reference = None
    if cfg.algorithm.beta > 0 or cfg.algorithm.log_kl:  # LoRA: the model itself with its adapter off; else a second copy of init_from
        reference = model if cfg.model.lora_rank else load_policy_model(cfg.model, rl.init_from).model.eval()
        if reference is not model:
            sharing.place_frozen(reference, world)
    teacher, distill = None, None
    if cfg.algorithm.teacher:  # on-policy distillation: the teacher scores every sampled token, or its whole distribution joins the loss
        teacher_policy = load_policy_model(cfg.model, cfg.algorithm.teacher)
        same_vocabulary(policy, teacher_policy, cfg.algorithm.teacher)
        teacher_model = teacher_policy.model.eval().requires_grad_(False)
        if teacher_in_loss:
            divergence, metric = DIVERGENCES[cfg.algorithm.teacher_loss]
            distill = Distill(sharing.logprobs(FullTeacher(teacher_model, divergence).logprobs_and_kl), cfg.algorithm.teacher_coef, metric)
        else:
            teacher = Teacher(
                teacher_model, recompute, policy.pad_id, rl.temperature, cfg.optim.micro_batch_size, cfg.optim.micro_batch_tokens,
                teacher_policy.vision,
            )
        credit = DistilledCredit(credit, teacher, cfg.algorithm.teacher_coef, cfg.algorithm.teacher_alone)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=rl.lr, betas=(0.9, 0.99), weight_decay=cfg.optim.weight_decay)
    planned = planned_optimizer_steps(cfg)  # if every step keeps episodes
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, rl_schedule(rl.lr_schedule, rl.warmup_steps, planned))
    learner = Learner(
        model, reference, trainable, optimizer, scheduler, algorithm, correction,
        replace(recompute, logprobs=sharing.logprobs(recompute.logprobs)), world, policy.pad_id, UpdateSettings.of(cfg), sharing,
        policy.vision, distill,
    )
    return LearnerParts(policy, learner, whole, credit, filters, teacher)


def open_rollouts(
    cfg: Config, parts: LearnerParts, generator: torch.Generator, run_dir: Path, checkpoint: Path | None, restored: Restored,
) -> tuple[Rollouts, Rubric]:
    """Where the episodes are sampled, and the Rubric that scores them: Ray workers (each with
    its own engine and Rubric), or an engine in this process sampling from the trained weights
    (async RL: from a copy of them, in a thread, while the trainer updates its own)."""
    world = parts.learner.world
    if cfg.rl.ray_workers:
        pool = RayRollouts(cfg, str(checkpoint or cfg.rl.init_from), run_dir, restored.rollouts)
        return pool, build_rubric(cfg.rewards, pool.env.default_rewards)
    name = "" if world.main else f"rank{world.rank}"
    model = copy.deepcopy(parts.learner.model).eval() if cfg.rl.max_staleness else parts.whole
    engine = open_engine(cfg, replace(parts.policy, model=model), generator, run_dir, name, restored.rollouts)
    rubric = build_rubric(cfg.rewards, engine.env.default_rewards)
    return LocalRollouts(engine, rubric, world, model if cfg.rl.max_staleness else None), rubric


def step_sampling(cfg: Config, pool: Rollouts, policy: PolicyModel) -> Sampling:
    """How each step draws its tasks and samples its episodes (rl and algorithm sections)."""
    rl = cfg.rl
    sampling = Sampling(
        rl.prompts_per_step, rl.group_size, cfg.algorithm.dynamic_sampling, cfg.algorithm.max_refill_rounds, cfg.run.seed,
        episode_streams=rl.sampling_streams == "episode",
    )
    if cfg.env.max_prompt_tokens is not None:
        sampling = replace(sampling, fits=prompt_fits(pool.env, policy.chat, policy.encode, cfg.env.max_prompt_tokens))
    if rl.task_pool:
        sampling = replace(sampling, pool=task_pool(pool.env, rl.task_pool, sampling))
    return sampling


def stalled_message(cfg: Config, idle_steps: int) -> str:
    return (
        f"{idle_steps} steps in a row had no group with a reward signal (each group's episodes all scored "
        f"the same): the starting model {cfg.rl.init_from} never produces a scorable, varied answer; start from "
        "an SFT checkpoint (`toolpolicy sft`, then set rl.init_from to RUN_DIR/sft/final) or raise "
        f"rl.temperature (now {cfg.rl.temperature}); rl.max_idle_steps=0 turns this stop off"
    )
