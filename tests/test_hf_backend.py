"""The local sampler's KV cache: shared prompts prefilled once, each episode's cache kept
across its turns, and nothing of it changing what is sampled or its log-probabilities."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from toolpolicy.envs import HotelEnv, make_env
from toolpolicy.model import PolicyModel
from toolpolicy.rollout import GenRequest, HFBackend, EpisodeLimits, RolloutEngine
from toolpolicy.rollout.backends import FoldedHFBackend
from toolpolicy.rollout.prefix_attention import SharedPrefix
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
    engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, EpisodeLimits(max_turns=8, max_tokens=640))
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
    # The two distinct prompts run their common prefix once, then each its own rest.
    shared = next(i for i, (a, b) in enumerate(zip(prompt, other)) if a != b)
    assert shared > 10 and backend.counts["prefill"] == len(prompt) + len(other) - shared

    observation = hotel_policy.encode("<|im_start|>user\nyes<|im_end|>\n<|im_start|>assistant\n")
    again = [GenRequest(k, prompt + first[k].ids + observation, 4) for k in (0, 2)]
    backend.generate(again)
    # Each continuing row runs its last sampled token (not yet in the cache) and the observation.
    assert backend.counts["prefill"] == len(prompt) + len(other) - shared + 2 * (1 + len(observation))

    # A request that does not extend its episode's cached ids starts over from its full ids.
    changed = GenRequest(0, prompt + observation, 4)
    backend.generate([changed])
    assert backend.counts["prefill"] == len(prompt) + len(other) - shared + 2 * (1 + len(observation)) + len(changed.ids)


def test_the_calc_sampler_is_unchanged_by_the_cache() -> None:
    """Single- and two-turn calc episodes: with and without the cache, the same samples."""
    policy = PolicyModel.load(CHECKPOINTS / "calc-sft")
    env = make_env("calc")
    tasks = [task for task in env.tasks("train", 4, seed=2) for _ in range(4)]
    runs = []
    for kind in (HFBackend, ForgetEveryTurn):
        engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend_of(policy, kind), EpisodeLimits())
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
            EpisodeLimits(max_turns=8, max_tokens=640),
        )
        return [t.token_ids for t in engine.run([tasks[i] for i in picked], seeds=seeds)]

    together = run([0, 1, 2, 2], [7, 8, 9, 10])
    assert run([2], [9]) == [together[2]]
    assert run([2, 1], [10, 8]) == [together[3], together[1]]
    assert together[2] != together[3], "two seeds of one task should sample differently"
    assert max(len(ids) for ids in together) > 300, "episodes of several turns"


class Bounded(HFBackend):
    """The sampler with a KV-cache budget of `rows` rows of `positions` positions for a decode
    batch (and as much for the rows it keeps), recording the most cache it kept between turns."""

    def __init__(self, policy: PolicyModel, rows: int, positions: int) -> None:
        super().__init__(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(5), 1.0)
        self.cache_bytes = 2 * rows * positions * self.position_bytes
        self.most_kept = 0

    def generate(self, requests: list[GenRequest]):
        out = super().generate(requests)
        self.most_kept = max(self.most_kept, sum(rows.nbytes() for rows in self._rows if rows is not None))
        return out


def test_a_cache_budget_changes_how_often_tokens_are_computed_never_which(hotel_policy: PolicyModel) -> None:
    """Multi-turn hotel episodes with a seed each, sampled with a KV cache room for two rows of
    700 positions (batches of one or two episodes; most episodes' caches dropped between turns
    and prefilled again): the same ids and log-probs as without a budget, more prefill, and
    never more cache kept than the budget."""
    unbounded, bounded = backend_of(hotel_policy), Bounded(hotel_policy, rows=2, positions=700)
    assert_same_hotel_samples(hotel_policy, unbounded, bounded, groups=3, size=2)
    assert bounded.counts["prefill"] > unbounded.counts["prefill"]
    assert 0 < bounded.most_kept <= bounded.cache_bytes // 2


def assert_same_hotel_samples(policy: PolicyModel, one: HFBackend, other: HFBackend, groups: int, size: int, seed: int = 100) -> list:
    """Multi-turn hotel episodes with a seed each sampled by both backends: the same ids, and
    log-probs within float32 rounding. Returns the first backend's episodes."""
    env = HotelEnv()
    tasks = [task for task in env.tasks("train", groups, seed=11) for _ in range(size)]
    limits = EpisodeLimits(max_turns=8, max_tokens=640)
    runs = []
    for backend in (one, other):
        engine = RolloutEngine(env, policy.chat, policy.encode, policy.decode, backend, limits)
        runs.append(engine.run(tasks, seeds=list(range(seed, seed + len(tasks)))))
    assert max(len(t.turn_spans) for t in runs[0]) >= 3, "episodes of several turns"
    assert [t.token_ids for t in runs[0]] == [t.token_ids for t in runs[1]]
    for a, b in zip(*runs):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    return runs[0]


def test_batches_fit_the_budget_in_order_and_a_long_request_runs_alone(hotel_policy: PolicyModel) -> None:
    # Budget: 3 rows of 100 positions. Requests of 30, 50, 70, 250 and 10 ids, each with 20
    # new tokens: 50, 70 and 90 positions. [0, 1] costs 2 x 70 = 140 <= 300; adding request 2
    # makes it 3 x 90 = 270, still in; a 4th row would exceed max_batch=3 anyway. Request 3 (270
    # positions) is alone; request 4 then costs 1 x 30.
    backend = HFBackend(hotel_policy.model, hotel_policy.stop_ids, hotel_policy.pad_id, torch.Generator(), max_batch=3)
    backend.cache_bytes = 2 * 300 * backend.position_bytes  # half of it for a batch
    requests = [GenRequest(k, [1] * n, 20) for k, n in enumerate((30, 50, 70, 250, 10))]
    assert backend.batches(requests) == [[0, 1, 2], [3], [4]]
    backend.cache_bytes = 2 * 200 * backend.position_bytes  # 3 x 90 = 270 > 200: request 2 starts a batch
    assert backend.batches(requests) == [[0, 1], [2], [3], [4]]
    assert backend.batches(requests, [4, 0]) == [[4, 0]]


def test_the_sampler_computes_logits_for_the_last_position_only(hotel_policy: PolicyModel) -> None:
    """Prefill and appended observations run many positions through the model, but only the
    last one's logits are needed to sample: the output head sees one position per row. The
    attention is SDPA's (on the CPU its flash kernel), which never holds a [B, H, L, L] score matrix."""
    assert hotel_policy.model.config._attn_implementation == "sdpa"
    positions = []
    hook = hotel_policy.model.get_output_embeddings().register_forward_hook(lambda _, args, out: positions.append(args[0].shape[1]))
    try:
        rollout(hotel_policy, backend_of(hotel_policy), groups=2, size=2)
    finally:
        hook.remove()
    assert positions and set(positions) == {1}


def test_prompts_that_begin_alike_run_their_prefix_once_and_sample_as_alone(hotel_policy: PolicyModel) -> None:
    """Distinct prompts with one system prompt run it once (RowCache.prefill's shared prefix),
    then each its question: each request's own stream samples the very ids it samples alone,
    with log-probs within float32 rounding."""
    system = hotel_policy.encode("<|im_start|>system\nYou book rooms for the guests of a hotel.<|im_end|>\n")
    questions = ["I would like to book a room.", "Cancel my booking, please.", "Is breakfast included?"]
    prompts = [system + hotel_policy.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n") for q in questions]
    together = backend_of(hotel_policy)
    batch = together.generate([GenRequest(k, p, 12, seed=k) for k, p in enumerate(prompts)])
    assert together.counts["prefill"] < sum(map(len, prompts)) - len(system)
    for k, prompt in enumerate(prompts):
        alone = backend_of(hotel_policy).generate([GenRequest(k, prompt, 12, seed=k)])[0]
        assert batch[k].ids == alone.ids
        assert torch.allclose(torch.tensor(batch[k].logprobs), torch.tensor(alone.logprobs), atol=1e-5)


class Unshared(FoldedHFBackend):
    """The folded sampler with every row holding a copy of its prompt's cache."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.share = False


class Kept(FoldedHFBackend):
    """The folded sampler, recording the most cache it keeps for a next turn and the prompts a
    batch's rows share."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.most_kept, self.prompts = 0, []

    def _generate(self, requests: list[GenRequest]):
        out = super()._generate(requests)
        self.most_kept = max(self.most_kept, sum(rows.nbytes() for rows in self._rows))
        self.prompts += [rows.prefix.attention.shape[0] for rows in self._rows if rows.prefix is not None]
        return out


@pytest.mark.parametrize("budget", [None, 2 * 4000])
def test_a_groups_episodes_share_their_prompt_and_sample_what_copies_sample(
    hotel_policy: PolicyModel, budget: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Multi-turn hotel episodes, 3 groups of 4 with a seed each, on the folded sampler: with
    each prompt's cache stored once for its group (rollout/prefix_attention.py) the same ids as
    with a copy per row, log-probs within float32 rounding, in less cache. With a budget of two
    batch's cache of 4000 positions (batches that each hold a few prompts, the rows of two
    batches joined again on a next turn) too."""
    joins = []
    join = SharedPrefix.joined
    monkeypatch.setattr(SharedPrefix, "joined", staticmethod(lambda prefixes: joins.append(len(prefixes)) or join(prefixes)))
    shared, copies = backend_of(hotel_policy, Kept), backend_of(hotel_policy, Unshared)
    assert shared.share and not copies.share
    for backend in (shared, copies):
        if budget is not None:
            backend.cache_bytes = budget * backend.position_bytes
    episodes = assert_same_hotel_samples(hotel_policy, shared, copies, groups=3, size=4, seed=200)
    if budget is None:
        assert shared.counts == copies.counts  # the same tokens run through the model
        assert shared.prompts[0] == 3  # the first turn: 12 rows, 3 prompts
        unshared_first_turn = 12 * max(len(t.token_ids) for t in episodes) * shared.position_bytes
        assert 0 < shared.most_kept < unshared_first_turn
    else:  # shared prompts take less of the budget: fewer rows dropped and prefilled again
        assert shared.counts["prefill"] < copies.counts["prefill"]
        assert max(joins) > 1 and shared.most_kept <= shared.cache_bytes // 2
