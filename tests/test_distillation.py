"""On-policy distillation: the teacher's per-token advantage by hand, and RL runs with a teacher."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest
import torch

import toolpolicy.algorithms.distill
from toolpolicy.build import load_config, load_policy_model
from toolpolicy.cli import main
from toolpolicy.config import ConfigError
from toolpolicy.rollout import Trajectory
from toolpolicy.algorithms.correction import Correction
from toolpolicy.algorithms.distill import DIVERGENCES
from toolpolicy.trainer.batch import FULL_SEQUENCES, SHARED_PROMPTS, collate
from toolpolicy.trainer.credit import OutcomeCredit
from toolpolicy.trainer.distributed import World
from toolpolicy.trainer.update import Learner, UpdateSettings, algorithm_of, policy_update
from toolpolicy.trainer.teacher import Distill, DistilledCredit, FullTeacher, Teacher, same_vocabulary
from toolpolicy.types import Episode, Task

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "src" / "toolpolicy" / "configs" / "smoke.yaml"
CALC_SFT = ROOT / "checkpoints" / "calc-sft"
HOTEL_SFT = ROOT / "checkpoints" / "hotel-sft"


def test_the_math_by_hand() -> None:
    result = doctest.testmod(toolpolicy.algorithms.distill)
    assert result.attempted >= 2 and result.failed == 0


def _trajectory(ids: list[int], prompt_len: int, sampled: list[float]) -> Trajectory:
    """A trajectory whose tokens after `prompt_len` were sampled with log-probs `sampled`
    (one observation token in the middle is not sampled)."""
    mask = [0] * prompt_len + [1] * (len(ids) - prompt_len)
    mask[prompt_len + 2] = 0
    logprobs = [0.0] * prompt_len + sampled
    logprobs[prompt_len + 2] = 0.0
    episode = Episode(Task("t", "q", "a"), [])
    return Trajectory(ids, mask, logprobs, prompt_len, episode, [(prompt_len, len(ids))])


def _by_hand(model: torch.nn.Module, trajectory: Trajectory) -> list[float]:
    """The model's log-prob of each token after the first, from its plain logits."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([trajectory.token_ids])).logits[0, :-1]  # [L-1, V]
    return torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(trajectory.token_ids[1:])[:, None])[:, 0].tolist()


def test_the_teacher_advantage_is_its_logprob_minus_the_sampled_one() -> None:
    teacher_policy = load_policy_model(load_config(SMOKE).model, CALC_SFT)
    generator = torch.Generator().manual_seed(0)
    vocab = teacher_policy.model.config.vocab_size
    prompt = torch.randint(5, vocab, (6,), generator=generator).tolist()
    trajectories = []
    for row in range(4):  # two groups of two, sharing their prompt
        response = torch.randint(5, vocab, (5 + row,), generator=generator).tolist()
        sampled = (-torch.rand(5 + row, generator=generator) * 3).tolist()
        trajectories.append(_trajectory(prompt + response, len(prompt), sampled))
    teacher = Teacher(teacher_policy.model, SHARED_PROMPTS, teacher_policy.pad_id, 1.0, 2, None)
    rewards = torch.tensor([[1.0], [0.0], [1.0], [1.0]], dtype=torch.float64)
    weights = torch.tensor([1.0], dtype=torch.float64)
    groups = torch.tensor([True, False])  # the second group does not train
    outcome = OutcomeCredit(algorithm_of(load_config(SMOKE, ["algorithm.preset=grpo"]).algorithm)[0].estimator)

    alone = DistilledCredit(outcome, teacher, 0.5, alone=True).advantages(trajectories, rewards, weights, 2, groups)
    added = DistilledCredit(outcome, teacher, 0.5, alone=False).advantages(trajectories, rewards, weights, 2, groups)
    task = outcome.advantages(trajectories, rewards, weights, 2, groups)  # [B]: +-0.707 in group 0, 0 in group 1
    assert alone.shape == (4, max(len(t.token_ids) for t in trajectories) - 1)
    for row, t in enumerate(trajectories):
        by_hand = _by_hand(teacher_policy.model, t)
        for position in range(len(t.token_ids) - 1):
            sampled = t.loss_mask[position + 1]
            expected = 0.5 * (by_hand[position] - t.logprobs[position + 1]) if sampled and row < 2 else 0.0
            assert alone[row, position].item() == pytest.approx(expected, abs=1e-4), (row, position)
            assert added[row, position].item() == pytest.approx(expected + float(task[row]), abs=1e-4), (row, position)
    assert abs(float(task[0])) > 0.5 and float(task[2]) == 0.0
    assert teacher.reverse_kl != 0.0  # measured on the rows it scored
    assert DistilledCredit(outcome, teacher, 0.5, alone=True).signal(trajectories, rewards, weights, 2).tolist() == [True, True]


def test_a_teacher_with_another_vocabulary_is_refused() -> None:
    model = load_config(SMOKE).model
    calc, hotel = load_policy_model(model, CALC_SFT), load_policy_model(model, HOTEL_SFT)
    same_vocabulary(calc, load_policy_model(model, CALC_SFT), str(CALC_SFT))
    with pytest.raises(ConfigError, match="field 'algorithm.teacher': .*hotel-sft has another vocabulary than the policy"):
        same_vocabulary(calc, hotel, str(HOTEL_SFT))
    with pytest.raises(ConfigError, match="algorithm.teacher_alone needs algorithm.teacher"):
        load_config(SMOKE, ["algorithm.teacher_alone=true"])


@pytest.mark.parametrize("loss", ["sampled", "full", "forward"])
def test_rl_distils_from_a_teacher_and_the_student_as_its_own_teacher_is_zero(tmp_path: Path, loss: str) -> None:
    """A student that is its own teacher: every sampled token's teacher log-prob is its own
    (the hf backend's log-probs are the trainer's numbers, to float32 rounding), so the
    reverse KL is 0 and the distilled advantage is 0 on every token of the first step. Only
    the first: where the sampler's and the trainer's numbers differ in the last bits (on some
    CPUs), AdamW turns those 1e-8 gradients into a step of full size and the second step's
    student is no longer the teacher."""
    args = ["train", str(SMOKE), "--set", f"rl.init_from={CALC_SFT}", "--set", f"algorithm.teacher={CALC_SFT}",
            "--set", "algorithm.teacher_alone=true", "--set", f"algorithm.teacher_loss={loss}", "--set", "rl.steps=2",
            "--set", f"run.dir={tmp_path}"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    kl = "distill/forward_kl" if loss == "forward" else "distill/reverse_kl"
    assert abs(rows[0][kl]) < 1e-5 and abs(rows[0]["loss"]) < 1e-5, rows[0]
    assert all(r["tokens/teacher"] > 0 for r in rows), rows
    if loss != "sampled":  # the policy's forward that gives the KL runs on whole sequences, as the teacher's
        assert all(r["tokens/update"] == r["tokens/teacher"] for r in rows), rows
    assert all(r["kept_groups"] == r["signal_groups"] == load_config(SMOKE).rl.prompts_per_step for r in rows)


def _trajectories(vocab: int, rows: int, generator: torch.Generator) -> list[Trajectory]:
    prompt = torch.randint(5, vocab, (6,), generator=generator).tolist()
    trajectories = []
    for row in range(rows):
        response = torch.randint(5, vocab, (5 + row,), generator=generator).tolist()
        trajectories.append(_trajectory(prompt + response, len(prompt), (-torch.rand(5 + row, generator=generator) * 3).tolist()))
    return trajectories


def _vocabulary_kl_by_hand(
    student: torch.nn.Module, teacher: torch.nn.Module, trajectory: Trajectory, temperature: float, forward: bool
) -> torch.Tensor:
    """KL(student || teacher) (or, `forward`, KL(teacher || student)) over the whole vocabulary
    at each sampled position, from both models' plain logits at the temperature, in float64,
    with the student's gradient.   [n]"""
    ids = torch.tensor([trajectory.token_ids])
    sampled = torch.tensor(trajectory.loss_mask[1:]).bool()  # position t predicts token t+1
    s = torch.log_softmax(student(input_ids=ids).logits[0, :-1][sampled].double() / temperature, -1)
    with torch.no_grad():
        t = torch.log_softmax(teacher(input_ids=ids).logits[0, :-1][sampled].double() / temperature, -1)
    return (t.exp() * (t - s)).sum(-1) if forward else (s.exp() * (s - t)).sum(-1)


@pytest.mark.parametrize("loss", ["full", "forward"])
def test_the_full_teacher_loss_is_the_vocabulary_kl_and_its_gradient_by_hand(loss: str) -> None:
    """algorithm.teacher_loss full (forward) with no task advantage: the loss is coef x the mean
    over sampled tokens of the reverse (forward) KL over the vocabulary, and its gradient is that
    of the same sum taken from both models' plain logits; a student that is its own teacher gets 0."""
    config = load_config(SMOKE)
    teacher = load_policy_model(config.model, CALC_SFT).model.eval()
    student = load_policy_model(config.model, CALC_SFT).model
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in student.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    trajectories = _trajectories(teacher.config.vocab_size, 4, generator)
    batch = collate(trajectories, 0)
    algorithm = algorithm_of(load_config(SMOKE, ["algorithm.preset=grpo"]).algorithm)[0]
    temperature, coef = 0.7, 0.5

    def update(distilled_from: torch.nn.Module) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        student.zero_grad(set_to_none=True)
        divergence, metric = DIVERGENCES[loss]
        distill = Distill(FullTeacher(distilled_from, divergence).logprobs_and_kl, coef, metric)
        settings = UpdateSettings(  # micro-batches of 3: two of them, whose shares add up
            group_size=4, mini_batches=1, passes=1, micro_batch_size=3, micro_batch_tokens=None, temperature=temperature, grad_clip=1.0,
        )
        optimizer = torch.optim.SGD(student.parameters(), lr=0.0)
        learner = Learner(
            student, None, list(student.parameters()), optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
            algorithm, Correction.named("none", tis_cap=2.0), FULL_SEQUENCES, World(), 0, settings, distill=distill,
        )
        sums, _ = policy_update(learner, batch, torch.zeros(len(trajectories)))
        return sums, {name: p.grad.clone() for name, p in student.named_parameters() if p.grad is not None}

    sums, grads = update(teacher)
    student.zero_grad(set_to_none=True)
    kl = torch.cat([_vocabulary_kl_by_hand(student, teacher, t, temperature, loss == "forward") for t in trajectories])
    by_hand = coef * kl.sum() / len(kl)
    by_hand.backward()
    assert sums["trained_tokens"] == len(kl) and float(kl.detach().min()) > 1e-3
    assert sums["distill/kl"] == pytest.approx(float(kl.sum()), rel=1e-4)
    assert sums["loss"] == pytest.approx(float(by_hand), rel=1e-4)  # the policy term is 0 with no advantage
    assert sums["tokens/teacher"] == float(batch.attention.sum())
    assert set(grads) == {name for name, p in student.named_parameters() if p.grad is not None}
    for name, p in student.named_parameters():
        assert torch.allclose(grads[name], p.grad.float(), atol=1e-6, rtol=1e-3), name

    sums, grads = update(student)  # its own teacher
    assert abs(sums["distill/kl"]) < 1e-4 and all(float(g.abs().max()) < 1e-5 for g in grads.values())


@pytest.mark.parametrize("loss", ["full", "forward"])
def test_the_full_teacher_loss_needs_a_teacher(loss: str) -> None:
    with pytest.raises(ConfigError, match=f"algorithm.teacher_loss {loss} needs algorithm.teacher"):
        load_config(SMOKE, [f"algorithm.teacher_loss={loss}"])
