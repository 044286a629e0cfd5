"""The local sampler's KV cache: shared prompts prefilled once, each episode's cache kept
across its turns, and nothing of it changing what is sampled or its log-probabilities."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolpolicy.envs import HotelEnv, make_env
from toolpolicy.model import PolicyModel
from toolpolicy.rollout import GenRequest, HFBackend, Limits, RolloutEngine
from toolpolicy.trainer.batch import collate, forward_logprobs

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"


@pytest.fixture(scope="module")
def hotel_policy() -> PolicyModel:
    return PolicyModel.load(CHECKPOINTS / "hotel-sft")


class ForgetEveryTurn(HFBackend):
    """The sampler without its cross-turn cache: every turn prefills the whole conversation."""

    def generate(self, requests: list[GenRequest]):
        self.forget()
        return super().generate(requests)


def rollout(policy: PolicyModel, backend: HFBackend, groups: int, size: int):
    env = HotelEnv()
    engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, Limits(max_turns=8, max_tokens=640))
    tasks = env.tasks("train", groups, seed=11)
    return engine.run([task for task in tasks for _ in range(size)])


def backend_of(policy: PolicyModel, kind: type[HFBackend] = HFBackend) -> HFBackend:
    return kind(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(5), temperature=1.0)


def test_cached_turns_sample_what_full_prefills_sample(hotel_policy: PolicyModel) -> None:
    """Multi-turn hotel episodes (observations and guest replies between turns, rows that stop
    while others go on): the same seed gives the same ids with or without the cross-turn cache,
    and the trainer's recomputed log-probs equal the sampled ones."""
    cached, fresh = backend_of(hotel_policy), backend_of(hotel_policy, ForgetEveryTurn)
    with_cache = rollout(hotel_policy, cached, groups=3, size=4)
    without = rollout(hotel_policy, fresh, groups=3, size=4)
    assert max(len(t.turn_spans) for t in with_cache) >= 3, "the episodes should span several turns"
    assert [t.token_ids for t in with_cache] == [t.token_ids for t in without]
    sampled = torch.tensor([lp for t in with_cache for lp in t.logprobs])
    assert torch.allclose(sampled, torch.tensor([lp for t in without for lp in t.logprobs]), atol=1e-5)

    batch = collate(with_cache, hotel_policy.pad_id)
    with torch.no_grad():
        recomputed, _ = forward_logprobs(hotel_policy.model, batch)
    gap = ((recomputed - batch.old_logprobs).abs() * batch.loss_mask).max()
    assert float(gap) < 1e-4, float(gap)
    # What the cache saves: later turns run only the tokens appended since the last one.
    assert cached.counts["prefill"] < fresh.counts["prefill"] / 2, (cached.counts, fresh.counts)


def test_a_group_prefills_its_prompt_once_and_turns_add_only_new_tokens(hotel_policy: PolicyModel) -> None:
    backend = backend_of(hotel_policy)
    prompt = hotel_policy.encode("<|im_start|>user\nI would like to book a room.<|im_end|>\n<|im_start|>assistant\n")
    other = prompt[:-3] + prompt[-2:]
    first = backend.generate([GenRequest(k, prompt, 8) for k in range(4)] + [GenRequest(4, other, 8)])
    assert backend.counts["prefill"] == len(prompt) + len(other)

    observation = hotel_policy.encode("<|im_start|>user\nyes<|im_end|>\n<|im_start|>assistant\n")
    again = [GenRequest(k, prompt + first[k].ids + observation, 4) for k in (0, 2)]
    backend.generate(again)
    # Each continuing row runs its last sampled token (not yet in the cache) and the observation.
    assert backend.counts["prefill"] == len(prompt) + len(other) + 2 * (1 + len(observation))

    # A request that does not extend its episode's cached ids starts over from its full ids.
    changed = GenRequest(0, prompt + observation, 4)
    backend.generate([changed])
    assert backend.counts["prefill"] == len(prompt) + len(other) + 2 * (1 + len(observation)) + len(changed.ids)


def test_the_calc_sampler_is_unchanged_by_the_cache() -> None:
    """Single- and two-turn calc episodes: with and without the cache, the same samples."""
    policy = PolicyModel.load(CHECKPOINTS / "calc-sft")
    env = make_env("calc")
    tasks = [task for task in env.tasks("train", 4, seed=2) for _ in range(4)]
    runs = []
    for kind in (HFBackend, ForgetEveryTurn):
        engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend_of(policy, kind), Limits())
        runs.append([t.token_ids for t in engine.run(tasks)])
    assert runs[0] == runs[1]


def test_an_episode_stream_samples_the_same_tokens_in_any_batch(hotel_policy: PolicyModel) -> None:
    """With a seed per episode, an episode's multi-turn hotel rollout is the same whether it
    runs alone, with others, or at another position in the batch (what lets torchrun ranks
    split a step's episodes); the seeds themselves still matter."""
    env = HotelEnv()
    tasks = env.tasks("train", 3, seed=11)

    def run(picked: list[int], seeds: list[int]):
        engine = RolloutEngine(
            env, hotel_policy.chat, hotel_policy.encode, hotel_policy.decode, backend_of(hotel_policy),
            Limits(max_turns=8, max_tokens=640),
        )
        return [t.token_ids for t in engine.run([tasks[i] for i in picked], seeds=seeds)]

    together = run([0, 1, 2, 2], [7, 8, 9, 10])
    assert run([2], [9]) == [together[2]]
    assert run([2, 1], [10, 8]) == [together[3], together[1]]
    assert together[2] != together[3], "two seeds of one task should sample differently"
    assert max(len(ids) for ids in together) > 300, "episodes of several turns"
