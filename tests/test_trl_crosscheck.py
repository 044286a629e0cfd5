"""Cross-check our losses against TRL's GRPOTrainer on identical tensors.

What is compared: TRL's own `GRPOTrainer._compute_loss` (trl/trainer/grpo_trainer.py), the
method that turns per-token log-probabilities, old log-probabilities, advantages, the
completion mask and (with beta > 0) reference log-probabilities into the scalar loss. It is
called unbound on a stub `self` that carries only the attributes the method reads; the stub's
`_get_per_token_logps_and_entropies` returns our fixed log-probability tensor instead of
running a model. So the whole of TRL's loss path runs unchanged from the log-probabilities
on: importance ratio (token or sequence level), clipping (epsilon / epsilon_high, `delta`),
k3 KL, and the loss_type-specific aggregation. Ours is POLICY_LOSSES[ratio_level] +
beta * kl_k3 -> aggregate_loss. Both values and gradients with respect to the
log-probabilities must match:

    TRL loss_type="grpo"                          == ppo_clip_loss + "seq_mean_token_mean"
    TRL loss_type="dr_grpo" (max_completion_length) == ppo_clip_loss + "seq_mean_token_sum_norm"(norm_length)
    TRL loss_type="dapo" (num_items_in_batch)      == ppo_clip_loss + "token_mean"
    TRL importance_sampling_level="sequence", "grpo" == gspo_loss + "seq_mean_token_mean"
    TRL delta=c (INTELLECT-2 two-sided clip)       == ppo_clip_loss(dual_clip=c), for c > 1 + clip_high

Several optimizer steps per rollout batch: TRL's num_iterations passes over a generation
batch cut into steps_per_generation slices, gradient_accumulation_steps slices a step, each
slice's loss by `_compute_loss`, against the trainer's own `train_on_batch` with
update_passes and mini_batches on a stand-in model whose log-probabilities are parameters.

Skipped, with the reason, when trl is not installed (`pip install trl`, the dev extra).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from toolpolicy.algorithms import POLICY_LOSSES, aggregate_loss, kl_k3

trl = pytest.importorskip("trl", reason="trl is not installed (`pip install -e '.[dev]'`): no TRL loss to compare with")
try:
    from trl.trainer.grpo_trainer import GRPOTrainer
except Exception as exc:  # pragma: no cover - depends on the installed trl / transformers pair
    pytest.skip(f"trl {trl.__version__} is installed but GRPOTrainer does not import: {exc}", allow_module_level=True)


class _OneProcess:
    """The accelerator calls _compute_loss makes, for a single process."""

    num_processes = 1

    @staticmethod
    def gather(x):
        return x

    @staticmethod
    def gather_for_metrics(x):
        return x

    @staticmethod
    def reduce(x, reduction="sum"):
        return x


def _trl_loss(logprobs, inputs, *, loss_type, level="token", eps_low=0.2, eps_high=0.2, beta=0.0, delta=None,
              max_completion_length=None, accumulation_steps=1, steps_per_generation=None):
    """TRL's GRPOTrainer._compute_loss on a stub trainer whose model 'returns' `logprobs`."""
    stub = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *args, **kwargs: (logprobs, torch.zeros_like(logprobs), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        beta=beta,
        args=SimpleNamespace(delta=delta, use_bias_correction_kl=False, steps_per_generation=steps_per_generation or accumulation_steps),
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=accumulation_steps,
        max_completion_length=max_completion_length,
        accelerator=_OneProcess(),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    loss = GRPOTrainer._compute_loss(stub, None, inputs)
    return loss, stub._metrics["train"]


def _batch(seed: int, rows: int = 4, width: int = 6, spread: float = 0.3):
    """Random log-probabilities near the old ones, right-padded masks of different lengths, signed advantages."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g, dtype=torch.float64) * 3  # [B, T]
    new = old + spread * torch.randn(rows, width, generator=g, dtype=torch.float64)  # [B, T]
    ref = old + 0.2 * torch.randn(rows, width, generator=g, dtype=torch.float64)  # [B, T]
    lengths = torch.tensor([width, width - 2, 3, 1][:rows] + [width] * max(0, rows - 4))
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()  # [B, T]
    advantages = torch.tensor([1.2, -0.7, 0.4, -1.5][:rows] + [0.3] * max(0, rows - 4), dtype=torch.float64)
    inputs = {
        "prompt_ids": torch.zeros(rows, 2, dtype=torch.long),
        "prompt_mask": torch.ones(rows, 2, dtype=torch.long),
        "completion_ids": torch.zeros(rows, width, dtype=torch.long),
        "completion_mask": mask,
        "advantages": advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum().double(),
    }
    return new, inputs


def _ours(new, inputs, *, level="token", aggregation, clip_low=0.2, clip_high=0.2, beta=0.0, dual_clip=None,
          norm_length=None, total_tokens=None, total_sequences=None):
    mask = inputs["completion_mask"]
    per_token, stats = POLICY_LOSSES[level](clip_low, clip_high, dual_clip)(new, inputs["old_per_token_logps"], inputs["advantages"], mask)
    if beta:
        per_token = per_token + beta * kl_k3(new, inputs["ref_per_token_logps"])
    total_tokens = float(mask.sum()) if total_tokens is None else total_tokens
    total_sequences = float(mask.shape[0]) if total_sequences is None else total_sequences
    loss = aggregate_loss(per_token, mask, aggregation, total_tokens, total_sequences, norm_length=norm_length)
    return loss, stats


def _value_and_grad(fn, new):
    leaf = new.clone().requires_grad_(True)
    out = fn(leaf)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return loss.detach(), leaf.grad, out


CASES = {
    # name: (TRL kwargs, our kwargs)
    "grpo": (dict(loss_type="grpo"), dict(aggregation="seq_mean_token_mean")),
    "grpo_kl": (dict(loss_type="grpo", beta=0.04), dict(aggregation="seq_mean_token_mean", beta=0.04)),
    "dr_grpo": (
        dict(loss_type="dr_grpo", max_completion_length=8),
        dict(aggregation="seq_mean_token_sum_norm", norm_length=8),
    ),
    "dapo": (dict(loss_type="dapo", eps_high=0.28), dict(aggregation="token_mean", clip_high=0.28)),
    "gspo": (
        dict(loss_type="grpo", level="sequence", eps_low=3e-4, eps_high=4e-4),
        dict(level="sequence", aggregation="seq_mean_token_mean", clip_low=3e-4, clip_high=4e-4),
    ),
    "gspo_wide_clip": (
        dict(loss_type="grpo", level="sequence", eps_low=0.05, eps_high=0.05, beta=0.04),
        dict(level="sequence", aggregation="seq_mean_token_mean", clip_low=0.05, clip_high=0.05, beta=0.04),
    ),
    "dual_clip": (dict(loss_type="grpo", delta=1.5), dict(aggregation="seq_mean_token_mean", dual_clip=1.5)),
}


SEEDS = [0, 2, 3]  # batches where every case below clips some tokens (checked in test_comparisons_are_not_vacuous)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_gradient_equal_trl(case, seed):
    trl_kwargs, our_kwargs = CASES[case]
    spread = 1.0 if case == "dual_clip" else 0.3  # ratios well past 1.5 so the dual clip binds
    new, inputs = _batch(seed, spread=spread)
    trl_value, trl_grad, _ = _value_and_grad(lambda lp: _trl_loss(lp, inputs, **trl_kwargs), new)
    our_value, our_grad, _ = _value_and_grad(lambda lp: _ours(lp, inputs, **our_kwargs), new)
    torch.testing.assert_close(our_value, trl_value, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(our_grad, trl_grad, rtol=1e-10, atol=1e-12)


def test_comparisons_are_not_vacuous():
    # Over the seeds used above: the dual clip binds on some A < 0 token, the token clip binds
    # on some token, and the wide GSPO clip clips some sequences but not all.
    dual, token, sequence = [], [], []
    for seed in SEEDS:
        new, inputs = _batch(seed, spread=1.0)
        dual.append(_ours(new, inputs, aggregation="seq_mean_token_mean", dual_clip=1.5)[1]["dual_clip_fraction"])
        new, inputs = _batch(seed)
        token.append(_ours(new, inputs, aggregation="token_mean", clip_high=0.28)[1]["clip_fraction"])
        wide = dict(level="sequence", aggregation="seq_mean_token_mean", clip_low=0.05, clip_high=0.05)
        sequence.append(_ours(new, inputs, **wide)[1]["clip_fraction"])
    assert all(f > 0 for f in dual) and all(f > 0 for f in token)
    assert any(0 < f < 1 for f in sequence)


@pytest.mark.parametrize("seed", [0, 1])
def test_token_level_clip_stats_equal_trl(seed):
    # TRL's clip_ratio/low_mean, high_mean, region_mean are masked token means, like ours.
    new, inputs = _batch(seed, spread=0.5)
    _, metrics = _trl_loss(new, inputs, loss_type="dapo", eps_high=0.28)
    _, stats = _ours(new, inputs, aggregation="token_mean", clip_high=0.28)
    assert stats["clip_low_fraction"] == pytest.approx(metrics["clip_ratio/low_mean"][0])
    assert stats["clip_high_fraction"] == pytest.approx(metrics["clip_ratio/high_mean"][0])
    assert stats["clip_fraction"] == pytest.approx(metrics["clip_ratio/region_mean"][0])
    assert stats["clip_fraction"] > 0


@pytest.mark.parametrize(
    "trl_kwargs, our_kwargs",
    [
        (dict(loss_type="grpo"), dict(aggregation="seq_mean_token_mean")),
        (
            dict(loss_type="dr_grpo", max_completion_length=8),
            dict(aggregation="seq_mean_token_sum_norm", norm_length=8),
        ),
        (dict(loss_type="dapo"), dict(aggregation="token_mean")),
    ],
)
def test_micro_batches_sum_like_trl_gradient_accumulation(trl_kwargs, our_kwargs):
    # Two equal micro-batches: TRL divides each by the accumulation steps (2); we divide by
    # whole-batch totals. Summed over micro-batches both equal the full-batch loss.
    new, inputs = _batch(3, rows=4)
    totals = dict(total_tokens=float(inputs["completion_mask"].sum()), total_sequences=4.0)
    trl_sum = our_sum = 0.0
    for rows in (slice(0, 2), slice(2, 4)):
        part = {k: (v[rows] if k != "num_items_in_batch" else v) for k, v in inputs.items()}
        trl_sum += float(_trl_loss(new[rows], part, accumulation_steps=2, **trl_kwargs)[0])
        our_sum += float(_ours(new[rows], part, **our_kwargs, **totals)[0])
    full = float(_ours(new, inputs, **our_kwargs)[0])
    assert our_sum == pytest.approx(full, rel=1e-12)
    assert trl_sum == pytest.approx(full, rel=1e-12)


class _ParameterLogprobs(torch.nn.Module):
    """A stand-in policy: the log-probability of episode e's sampled token j is start[e, j] +
    theta[e, j], theta trained from 0 (so the first step is on-policy and later ones are not).
    Token 0 of each episode's ids is the episode's number, which is how `recompute` finds its row."""

    def __init__(self, start: torch.Tensor):
        super().__init__()
        self.start = start
        self.theta = torch.nn.Parameter(torch.zeros_like(start))

    def logprobs(self, model, batch, temperature=1.0, with_entropy=False):
        episodes = batch.input_ids[:, 0]  # [b]
        width = batch.targets.shape[1]
        values = (self.start[episodes, :width] + self.theta[episodes, :width]) * batch.loss_mask  # [b, l]
        return values, torch.zeros_like(values) if with_entropy else None


class _RecordingSGD(torch.optim.SGD):
    """SGD that keeps each step's gradient."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.grads = []

    def step(self, closure=None):
        self.grads.append(self.param_groups[0]["params"][0].grad.detach().clone())
        return super().step(closure)


MULTI_STEP_CASES = {
    "dapo": (dict(loss_type="dapo", eps_high=0.28), ["algorithm.preset=dapo"]),
    "grpo": (dict(loss_type="grpo"), ["algorithm.preset=grpo"]),
    "gspo": (dict(loss_type="grpo", level="sequence", eps_low=3e-4, eps_high=4e-4), ["algorithm.preset=gspo"]),
}


@pytest.mark.parametrize("case", sorted(MULTI_STEP_CASES))
def test_several_steps_per_batch_equal_trl_num_iterations(case):
    """8 episodes (groups of 2); TRL: steps_per_generation 4 slices of 2, gradient_accumulation_steps
    2, num_iterations 2 -> 4 optimizer steps; ours: mini_batches 2, update_passes 2 -> 4 steps.
    The same gradient at every step, the same weights after, the same summed loss, to 1e-6;
    and the later steps clip (the ratio has left 1), which one step per batch never does."""
    from toolpolicy.algorithms.correction import Correction
    from toolpolicy.rollout import Trajectory
    from toolpolicy.trainer.update import train_on_batch

    trl_kwargs, settings = MULTI_STEP_CASES[case]
    g = torch.Generator().manual_seed(7)
    episodes, width, lr = 8, 6, 10.0  # a step large enough for the next ones to clip
    lengths = [6, 4, 3, 6, 1, 5, 2, 6]
    old = -torch.rand(episodes, width, generator=g) * 2  # [E, T] the sampler's log-probs
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()  # [E, T]
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.2, -1.2, -0.3, 0.3])  # [E], whole groups of 2
    trajectories = [
        Trajectory([e] + [1] * n, [0] + [1] * n, [0.0] + old[e, :n].tolist(), 1, None) for e, n in enumerate(lengths)
    ]

    # TRL: the generation batch in steps_per_generation slices, reused num_iterations times.
    theta = torch.zeros(episodes, width, requires_grad=True)
    trl_grads, trl_loss = [], 0.0
    slices = [slice(2 * k, 2 * k + 2) for k in range(4)]
    for _ in range(2):  # num_iterations
        for step in range(2):  # steps_per_generation / gradient_accumulation_steps
            theta.grad = None
            for rows in slices[2 * step : 2 * step + 2]:
                inputs = {
                    "prompt_ids": torch.zeros(2, 1, dtype=torch.long), "prompt_mask": torch.ones(2, 1, dtype=torch.long),
                    "completion_ids": torch.zeros(2, width, dtype=torch.long), "completion_mask": mask[rows].long(),
                    "advantages": advantages[rows], "old_per_token_logps": old[rows], "num_items_in_batch": mask.sum(),
                }
                loss, _ = _trl_loss((old + theta)[rows], inputs, accumulation_steps=2, steps_per_generation=4, **trl_kwargs)
                loss.backward()
                trl_loss += float(loss)
            trl_grads.append(theta.grad.clone())
            with torch.no_grad():
                theta -= lr * theta.grad

    model = _ParameterLogprobs(old)
    optimizer = _RecordingSGD([model.theta], lr)
    learner = _learner(model, optimizer, Correction.named("none", tis_cap=2.0), settings, mini_batches=2, passes=2)
    done = train_on_batch(learner, trajectories, list(range(episodes)), advantages)
    assert len(optimizer.grads) == len(trl_grads) == 4
    for ours, theirs in zip(optimizer.grads, trl_grads):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(model.theta.detach(), theta.detach(), rtol=1e-6, atol=1e-6)
    assert done.sums["loss"] == pytest.approx(trl_loss, rel=1e-6, abs=1e-6)
    assert done.sums["clip_fraction"] > 0  # later steps are off-policy, so the clip acts


def _learner(model, optimizer, correction, cfg_settings, mini_batches, passes):
    from toolpolicy.build import load_config
    from toolpolicy.trainer.batch import Recompute
    from toolpolicy.trainer.distributed import World
    from toolpolicy.trainer.update import Learner, UpdateSettings, algorithm_of

    algorithm, _, _ = algorithm_of(load_config(None, cfg_settings).algorithm)
    return Learner(
        model, None, [model.theta], optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), algorithm,
        correction, Recompute(model.logprobs, lambda batch: int(batch.attention.sum())), World(), 0,
        UpdateSettings(group_size=2, mini_batches=mini_batches, passes=passes, micro_batch_size=2, micro_batch_tokens=None,
                       temperature=1.0, grad_clip=1e9),
    )


def test_tis_over_several_steps_takes_pi_old_before_the_first_step():
    """TIS takes pi_old from the trainer: over several steps, from the weights that sampled
    (one forward before the first step), not from the moved ones. With a sampler that agrees
    with the trainer, TIS is then the uncorrected update step for step; taking pi_old from the
    current weights instead would make every ratio 1 and clip nothing."""
    from toolpolicy.algorithms.correction import Correction
    from toolpolicy.rollout import Trajectory
    from toolpolicy.trainer.update import train_on_batch

    g = torch.Generator().manual_seed(3)
    lengths = [5, 3, 6, 2, 4, 6, 1, 5]
    old = -torch.rand(8, 6, generator=g) * 2
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 1.2, -1.2, -0.3, 0.3])
    trajectories = [Trajectory([e] + [1] * n, [0] + [1] * n, [0.0] + old[e, :n].tolist(), 1, None) for e, n in enumerate(lengths)]
    runs = {}
    for name in ("none", "tis"):
        model = _ParameterLogprobs(old)
        optimizer = _RecordingSGD([model.theta], 10.0)
        learner = _learner(model, optimizer, Correction.named(name, tis_cap=2.0), ["algorithm.preset=dapo"], mini_batches=2, passes=2)
        runs[name] = (train_on_batch(learner, trajectories, list(range(8)), advantages), optimizer.grads)
    (none, none_grads), (tis, tis_grads) = runs["none"], runs["tis"]
    for a, b in zip(none_grads, tis_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert tis.sums["clip_fraction"] == pytest.approx(none.sums["clip_fraction"]) and tis.sums["clip_fraction"] > 0
    assert tis.sums["mismatch/tokens"] == sum(lengths) and tis.sums["mismatch/abs_max"] < 1e-6  # measured once, before
