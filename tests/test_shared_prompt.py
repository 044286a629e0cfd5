"""The update runs each distinct prompt once: same log-probs, entropy and gradients as full sequences."""

from __future__ import annotations

from pathlib import Path

import torch

from toolpolicy.envs import CalcEnv
from toolpolicy.model import PolicyModel
from toolpolicy.rollout import HFBackend, EpisodeLimits, RolloutEngine, Trajectory
from toolpolicy.types import Episode, Task
from toolpolicy.trainer.batch import (
    FULL_SEQUENCES, SHARED_PROMPTS, collate, distinct_prompt_tokens, micro_batches, update_order, update_positions,
)

CALC_SFT = Path(__file__).resolve().parents[1] / "checkpoints" / "calc-sft"


def test_shared_prompts_give_the_full_sequences_log_probs_and_gradients() -> None:
    policy = PolicyModel.load(CALC_SFT)
    env = CalcEnv()
    backend = HFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0))
    engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, EpisodeLimits(max_tokens=192, max_turn_tokens=64))
    tasks = env.tasks("train", 3, seed=1)
    trajectories = engine.run([task for task in tasks for _ in range(4)])
    assert any(len(t.turn_spans) > 1 for t in trajectories), "some episodes should call the calculator"
    batch = collate(trajectories, policy.pad_id)
    model = policy.model.train()
    results = {}
    for name, recompute in (("full", FULL_SEQUENCES), ("shared", SHARED_PROMPTS)):
        model.zero_grad()
        pieces = []
        for _, piece in micro_batches(batch, 5):  # pieces that cut through groups: prompts seen twice
            logprobs, entropy = recompute.logprobs(model, piece, 0.7, with_entropy=True)
            advantage = torch.linspace(-1, 1, piece.input_ids.shape[0])[:, None]
            (-(logprobs * piece.loss_mask * advantage).sum()).backward()
            pieces.append((logprobs.detach() * piece.loss_mask, entropy * piece.loss_mask))
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        results[name] = (pieces, grads)
    (full, full_grads), (shared, shared_grads) = results["full"], results["shared"]
    for (a_logp, a_ent), (b_logp, b_ent) in zip(full, shared):
        assert torch.allclose(a_logp, b_logp, atol=1e-5), float((a_logp - b_logp).abs().max())
        assert torch.allclose(a_ent, b_ent, atol=1e-5)
    assert float((full_grads - shared_grads).norm() / full_grads.norm()) < 1e-4
    # What it saves: the prompts are most of the tokens, and a group's rows share one.
    prompts = int(batch.prompt_lens.sum())
    assert distinct_prompt_tokens(batch) * 4 == prompts
    assert SHARED_PROMPTS.tokens(batch) == FULL_SEQUENCES.tokens(batch) - prompts + prompts // 4


def test_logits_only_at_trained_positions_a_chunk_at_a_time_give_a_full_forwards_values_and_gradients(monkeypatch) -> None:
    """forward_logprobs runs the output head only where a row trains (not on the prompt, not on
    tool output), a few positions at a time (here 7: the shipped model's 396-token vocabulary's
    logits of every trained position would fit one chunk): the trained positions' log-probs, entropies and the
    gradients are a full forward's, and every other position holds 0."""
    from toolpolicy.algorithms import entropy_from_logits, token_logprobs
    from toolpolicy.trainer import batch as batch_module
    from toolpolicy.trainer.batch import forward_logprobs, logit_chunk

    policy = PolicyModel.load(CALC_SFT)
    monkeypatch.setattr(batch_module, "LOGIT_CHUNK_BYTES", 4 * policy.model.config.vocab_size * 7)
    assert logit_chunk(policy.model) == 7
    env = CalcEnv()
    backend = HFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(3))
    engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, EpisodeLimits(max_tokens=192, max_turn_tokens=64))
    batch = collate(engine.run(env.tasks("train", 4, seed=2)), policy.pad_id)
    mask = batch.loss_mask.bool()
    assert int(mask.sum()) > 3 * 7 and not mask.all(), "several chunks, and untrained positions between them"
    model = policy.model.train()
    grads, outputs, losses = [], [], []
    for ours in (True, False):
        model.zero_grad()
        if ours:
            logprobs, entropy = forward_logprobs(model, batch, 0.7, with_entropy=True)
        else:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention).logits[:, :-1].float() / 0.7
            logprobs, entropy = token_logprobs(logits, batch.targets), entropy_from_logits(logits.detach())
        loss = -(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum()
        loss.backward()
        losses.append(float(loss.detach()))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        outputs.append((logprobs.detach(), entropy))
    (ours_logp, ours_ent), (full_logp, full_ent) = outputs
    assert abs(losses[0] - losses[1]) < 1e-6
    assert torch.allclose(ours_logp[mask], full_logp[mask], atol=1e-5) and torch.allclose(ours_ent[mask], full_ent[mask], atol=1e-5)
    assert not ours_logp[~mask].any() and not ours_ent[~mask].any()
    assert float((grads[0] - grads[1]).abs().max()) < 1e-6 * max(1.0, float(grads[1].abs().max()))


def _episode(prompt: int, prompt_len: int, response_len: int) -> Trajectory:
    ids = [prompt] * prompt_len + [7] * response_len
    mask = [0] * prompt_len + [1] * response_len
    return Trajectory(ids, mask, [0.0] * len(ids), prompt_len, Episode(Task("t", "q", "a"), [], []))


def test_the_update_pads_rows_to_similar_lengths_unless_prompts_cost_more() -> None:
    """Two groups of 4 with short prompts, each with one long multi-turn episode: group by
    group, each micro-batch of 4 pads every row to 60; by length, the two long ones share one.
    With long prompts, mixing groups would run each prompt in every micro-batch: kept as given."""
    short = [_episode(g, 5, 60 if k == 0 else 4) for g in range(2) for k in range(4)]
    given = list(range(8))
    assert update_positions([short[i] for i in given], 4) == 2 * (5 + 4 * 60)
    chosen = update_order(given, short, 4)
    assert sorted(chosen) == given and set(chosen[-2:]) == {0, 4}
    assert update_positions([short[i] for i in chosen], 4) == (5 + 5 + 4 * 4) + (5 + 5 + 4 * 60)
    long_prompts = [_episode(g, 500, 60 if k == 0 else 4) for g in range(2) for k in range(4)]
    assert update_order(given, long_prompts, 4) == given


def test_micro_batches_hold_at_most_size_rows_and_max_tokens_positions() -> None:
    # Rows of 10, 12, 30, 31, 80 and 9 tokens, at most 4 rows and 64 positions (rows x the
    # piece's longest): [10, 12] = 24, adding 30 makes 3 x 30 = 90 > 64; [30, 31] = 62;
    # 80 alone (longer than the budget); [9] = 9. Without a token budget: rows 4 by 4.
    rows = [_episode(0, 5, n - 5) for n in (10, 12, 30, 31, 80, 9)]
    batch = collate(rows, 0)
    pieces = micro_batches(batch, 4, 64)
    assert [rows for rows, _ in pieces] == [slice(0, 2), slice(2, 4), slice(4, 5), slice(5, 6)]
    assert [tuple(piece.input_ids.shape) for _, piece in pieces] == [(2, 12), (2, 31), (1, 80), (1, 9)]
    assert [rows for rows, _ in micro_batches(batch, 4)] == [slice(0, 4), slice(4, 6)]


def test_sft_loss_in_token_bounded_micro_batches_is_the_same() -> None:
    """The SFT loss and its gradients do not depend on how the batch is cut: 12 calc episodes
    in one micro-batch, or in pieces of at most 300 positions."""
    from toolpolicy.trainer.sft import sft_loss

    policy = PolicyModel.load(CALC_SFT)
    env = CalcEnv()
    backend = HFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(4))
    engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, EpisodeLimits(max_tokens=192, max_turn_tokens=64))
    examples = engine.run(env.tasks("train", 12, seed=3))
    model = policy.model.train()
    results = []
    for tokens in (None, 300):
        model.zero_grad()
        loss = sft_loss(model, examples, policy.pad_id, 32, tokens)
        results.append((loss, torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert len(micro_batches(collate(examples, policy.pad_id), 32, 300)) > 2
    (whole, whole_grads), (pieces, piece_grads) = results
    assert abs(whole - pieces) < 1e-6
    assert float((whole_grads - piece_grads).abs().max()) < 1e-6
