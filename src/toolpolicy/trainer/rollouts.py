"""Where RL's episodes are rolled out: in this process, or on Ray rollout workers.

`Rollouts.run(tasks, seeds, group_size)` returns every episode of the step, scored, in the
order of `tasks`, wherever it ran:

- `LocalRollouts`: this process's engine. Under torchrun each rank runs its contiguous
  share of the groups and receives the others' (trainer/distributed.py).
- `RayRollouts` (`ray_rollout_workers: N`): N Ray actors, each with its own model copy,
  backend, environment, gate and audit log, run contiguous shares of the groups; the
  learner, on the driver, sends them the weights after every optimizer step through
  Ray's object store (one `ray.put`, read by every actor). `ray_address` names a running
  cluster (`ray start --head`), or "local" starts one for the run.

Either way each episode samples from its own stream (`sampling_streams: episode`), so the
step's episodes are the same ones a single process samples. Each engine appends its gate's
decisions to its own audit log: RUN_DIR/audit.jsonl for the first (rank 0, or a single
process), audit.rankN.jsonl or audit.workerN.jsonl for the others (Ray workers on other
machines need RUN_DIR on a shared file system). `state()` is each log's own state
(`AuditLog.state`, by file name), which a checkpoint keeps beside the optimizer's; a
resumed run opens its engines with it, and each log is cut back to it
(`AuditLog.restore`) before the steps after it are taken again.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import torch

from toolpolicy.atomic import replace_file
from toolpolicy.build import build_engine, build_env, build_rubric, load_policy_model
from toolpolicy.config import Config, ConfigError
from toolpolicy.envs.base import Env
from toolpolicy.gate import AuditLog
from toolpolicy.model import PolicyModel
from toolpolicy.rewards import Score
from toolpolicy.rollout import RolloutEngine, Trajectory
from toolpolicy.rollout.branch import Branch
from toolpolicy.trainer.distributed import World
from toolpolicy.types import Task

RolloutState = dict[str, dict[str, Any]]
"""What a checkpoint keeps of the rollout pool: each audit log's `AuditLog.state()`, by file name."""

START_FILE = "rollout_start.json"

Scored = list[tuple[Trajectory, Score]]
Branches = list[Branch | None] | None
"""Per episode of a round, the prefix it continues (None: from its task's start)."""
Pending = Callable[[], Scored]
"""A submitted round of episodes: call it to wait for them."""


class Rollouts(Protocol):
    env: Env
    """The environment, for the step's tasks and its success reward."""

    def submit(self, tasks: list[Task], seeds: list[int] | None, group_size: int, branches: Branches = None) -> Pending:
        """Start one scored episode per task (groups contiguous); the result holds all of
        them, in order. A round sees the weights of every `sync` called before it. With
        `branches`, episode i continues branches[i] (rollout/branch.py)."""
        ...

    def sync(self, model: torch.nn.Module) -> None:
        """The samplers take `model`'s new weights (after an optimizer step), once the rounds
        submitted before have been sampled."""
        ...

    def counts(self) -> Counter[str]:
        """Token positions run by every sampler so far, by kind."""
        ...

    def state(self) -> RolloutState:
        """Every engine's state, for a checkpoint (the same on every process)."""
        ...

    def close(self) -> None: ...


def open_engine(
    cfg: Config, policy: PolicyModel, generator: torch.Generator, run_dir: Path, name: str, restored: RolloutState
) -> RolloutEngine:
    """An RL rollout engine whose audit log (if `gate.audit`) continues from `restored`: the
    decisions after the state it names are cut, since their steps are about to be taken
    again. `name` tells the engines of one run apart: "" for the first, else "rank1",
    "worker0", ..."""
    audit_file = f"audit.{name}.jsonl" if name else "audit.jsonl"  # one writer per log
    if cfg.gate.audit and audit_file in restored:
        AuditLog.restore(run_dir / audit_file, restored[audit_file])
    return build_engine(cfg, policy, generator, cfg.rl.temperature, audit_file=audit_file)


def engine_state(engine: RolloutEngine) -> RolloutState:
    audit = engine.gate.audit
    return {audit.path.name: audit.state()} if audit is not None else {}


def merged(states: list[RolloutState]) -> RolloutState:
    return {name: state for part in states for name, state in part.items()}


def saved_start(phase_dir: Path) -> RolloutState:
    """The pool's state when RL began (PHASE_DIR/rollout_start.json; empty if none): where
    a run killed before its first checkpoint cuts its audit logs back to."""
    path = phase_dir / START_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def save_start(phase_dir: Path, state: RolloutState) -> None:
    phase_dir.mkdir(parents=True, exist_ok=True)
    replace_file(phase_dir / START_FILE, json.dumps(state))


def score_all(
    engine: RolloutEngine, rubric: Any, tasks: list[Task], seeds: list[int] | None, progress: str | None = None,
    branches: Branches = None,
) -> Scored:
    return [(t, rubric.score(t.episode)) for t in engine.run(tasks, seeds=seeds, progress=progress, branches=branches)]


class LocalRollouts:
    """This process's engine; under torchrun, this rank's share of the groups, then all of them.

    Synchronous by default: a round runs when it is submitted. With a `sampler` (async RL,
    `max_staleness` > 0) the engine samples from that copy of the policy in a thread of its
    own, one round after another, while the trainer updates its model; `sync` copies the
    new weights in after the rounds already submitted, so a round sees exactly the updates
    made before it was submitted. A synchronous main process shows a bar of finished episodes."""

    def __init__(self, engine: RolloutEngine, rubric: Any, world: World, sampler: torch.nn.Module | None = None) -> None:
        self.engine, self.rubric, self.world, self.sampler = engine, rubric, world, sampler
        self.env = engine.env
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="rollout") if sampler is not None else None
        self.progress = "rollout" if world.main and sampler is None else None

    def submit(self, tasks: list[Task], seeds: list[int] | None, group_size: int, branches: Branches = None) -> Pending:
        groups = self.world.share(len(tasks) // group_size)
        mine = slice(groups.start * group_size, groups.stop * group_size)

        def run() -> Scored:
            return score_all(
                self.engine, self.rubric, tasks[mine], seeds[mine] if seeds else None, self.progress,
                branches[mine] if branches else None,
            )

        if self.thread is None:
            scored = self.world.gather(run())
            return lambda: scored
        return self.thread.submit(run).result

    def sync(self, model: torch.nn.Module) -> None:
        if self.thread is None:
            self.engine.backend.sync(model)
            return
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}  # as of now, not of when it runs
        self.thread.submit(self._load, state)

    def _load(self, state: dict[str, torch.Tensor]) -> None:
        self.sampler.load_state_dict(state)
        self.engine.backend.sync(self.sampler)

    def counts(self) -> Counter[str]:
        return self.world.sum_counts(Counter(self.engine.backend.counts))

    def state(self) -> RolloutState:
        return merged(self.world.gather([engine_state(self.engine)]))

    def close(self) -> None:
        if self.thread is not None:
            self.thread.shutdown(cancel_futures=True)
        self.engine.close()


class RolloutWorker:
    """A Ray actor's state: a policy copy, its engine and the Rubric, built in the worker."""

    def __init__(self, cfg: Config, checkpoint: str, run_dir: str, index: int, restored: RolloutState) -> None:
        torch.set_num_threads(max(1, cfg.run.threads))
        self.policy = load_policy_model(cfg.model, checkpoint)
        generator = torch.Generator().manual_seed(cfg.run.seed)
        self.engine = open_engine(cfg, self.policy, generator, Path(run_dir), f"worker{index}", restored)
        self.rubric = build_rubric(cfg.rewards, self.engine.env.default_rewards)

    def run(self, tasks: list[Task], seeds: list[int] | None, branches: Branches = None) -> Scored:
        return score_all(self.engine, self.rubric, tasks, seeds, branches=branches)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.policy.model.load_state_dict(state)
        self.engine.backend.sync(self.policy.model)

    def counts(self) -> Counter[str]:
        return Counter(self.engine.backend.counts)

    def state(self) -> RolloutState:
        return engine_state(self.engine)

    def close(self) -> None:
        self.engine.close()


class RayRollouts:
    """`ray_rollout_workers` actors, each running a contiguous share of the step's groups."""

    def __init__(self, cfg: Config, checkpoint: str, run_dir: Path, restored: RolloutState) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError("rl.ray_workers needs Ray: pip install 'toolpolicy[ray]'") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            address = None if cfg.rl.ray_address == "local" else cfg.rl.ray_address
            ray.init(address=address, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        actor = ray.remote(num_cpus=0)(RolloutWorker)  # threads are the config's, not Ray's CPU slots
        self.workers = [actor.remote(cfg, str(checkpoint), str(run_dir), k, restored) for k in range(cfg.rl.ray_workers)]
        ray.get([w.counts.remote() for w in self.workers])  # built (or their error raised) before the first step
        self.env = build_env(cfg.env)

    def submit(self, tasks: list[Task], seeds: list[int] | None, group_size: int, branches: Branches = None) -> Pending:
        shares = [World(k, len(self.workers)).share(len(tasks) // group_size) for k in range(len(self.workers))]
        parts = [slice(s.start * group_size, s.stop * group_size) for s in shares]
        pending = [
            w.run.remote(tasks[p], seeds[p] if seeds else None, branches[p] if branches else None)
            for w, p in zip(self.workers, parts)
        ]
        return lambda: [pair for part in self.ray.get(pending) for pair in part]

    def sync(self, model: torch.nn.Module) -> None:
        state = self.ray.put({k: v.detach().cpu() for k, v in model.state_dict().items()})
        self.ray.get([w.load_weights.remote(state) for w in self.workers])

    def counts(self) -> Counter[str]:
        return sum(self.ray.get([w.counts.remote() for w in self.workers]), Counter())

    def state(self) -> RolloutState:
        return merged(self.ray.get([w.state.remote() for w in self.workers]))

    def close(self) -> None:
        try:
            self.ray.get([w.close.remote() for w in self.workers])
        finally:
            for w in self.workers:
                self.ray.kill(w)
            if self.started:
                self.ray.shutdown()
