"""The rollout engine: token ids are the truth, the mask is exact, bad calls never crash."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from toolpolicy.envs import CalcEnv
from toolpolicy.envs.calc import ExpertStyle
from toolpolicy.model import PolicyModel, codec, make_template
from toolpolicy.model.embedded import train_tokenizer
from toolpolicy.rollout import HFBackend, EpisodeLimits, RolloutEngine, ScriptedBackend
from toolpolicy.rollout.backends import Generation, GenRequest
from toolpolicy.trainer.batch import collate, forward_logprobs
from toolpolicy.model import char_codec
from toolpolicy.eval.metrics import ScoredEpisode, summarize
from toolpolicy.gate import Gate, Policy
from toolpolicy.rewards import policy_violation
from toolpolicy.tools import ToolSet, tool
from toolpolicy.types import Message, Task, ToolCall, ToolResult

TEMPLATE = make_template(compact=True)


def scripted_engine(scripts: dict[int, list[Message]], encode, decode, limits: EpisodeLimits = EpisodeLimits(max_tokens=4000, max_turn_tokens=400)) -> RolloutEngine:
    backend = ScriptedBackend(scripts, TEMPLATE.render_assistant, encode)
    return RolloutEngine(CalcEnv(), TEMPLATE, encode, decode, backend, limits)


BAD_JSON = Message("assistant", '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}\n</tool_call>')
WRONG_ARG = Message("assistant", "", (ToolCall("calculator", {"expr": "12 * 7"}),))
UNKNOWN = Message("assistant", "", (ToolCall("search", {"query": "x"}),))
GOOD = Message("assistant", "", (ToolCall("calculator", {"expression": "12 * 7"}),))
ANSWER = Message("assistant", "Answer: 84")


@pytest.fixture(scope="module")
def tokenizer():
    env = CalcEnv()
    rng = random.Random(0)
    texts = []
    for task in env.tasks("train", 200, seed=1):
        turns = env.expert_turns(task, rng, ExpertStyle(0.5, 0.5, 0.3))
        texts.append(TEMPLATE.render(env.initial_messages(task) + turns, env.tools.specs()))
    return train_tokenizer(texts, 400, TEMPLATE)


def test_text_of_a_trajectory_is_the_rendered_conversation():
    """Appending fragments gives exactly the template's rendering of the whole episode."""
    encode, decode = char_codec()
    engine = scripted_engine({0: [BAD_JSON, GOOD, ANSWER]}, encode, decode)
    (trajectory,) = engine.run(CalcEnv().tasks("train", 1, seed=3))
    episode = trajectory.episode
    assert [m.role for m in episode.messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    rendered = TEMPLATE.render(episode.messages, CalcEnv().tools.specs())
    assert decode(trajectory.token_ids) == rendered.removesuffix("\n")
    assert episode.messages[-2].content == "84"


def test_loss_mask_is_one_exactly_on_assistant_tokens(tokenizer):
    encode, decode = codec(tokenizer)
    engine = scripted_engine({0: [WRONG_ARG, GOOD, ANSWER]}, encode, decode)
    (trajectory,) = engine.run(CalcEnv().tasks("train", 1, seed=3))
    ids, mask = trajectory.token_ids, trajectory.loss_mask
    assert len(ids) == len(mask) == len(trajectory.logprobs)
    assert sum(mask[: trajectory.prompt_len]) == 0
    # Every assistant turn's tokens, and only those, carry mask 1.
    expected = [0] * len(ids)
    for start, end in trajectory.turn_spans:
        expected[start:end] = [1] * (end - start)
    assert mask == expected
    assert len(trajectory.turn_spans) == 3
    turn_texts = [decode(ids[s:e]) for s, e in trajectory.turn_spans]
    assert turn_texts == [TEMPLATE.render_assistant(m) for m in (WRONG_ARG, GOOD, ANSWER)]
    # Between turns: tool output framed by the template, all mask 0.
    gap = decode(ids[trajectory.turn_spans[1][1] : trajectory.turn_spans[2][0]])
    assert "<tool_response>\n84\n</tool_response>" in gap


def test_malformed_calls_become_observations_and_events():
    encode, decode = char_codec()
    engine = scripted_engine({0: [BAD_JSON, UNKNOWN, WRONG_ARG, ANSWER]}, encode, decode, EpisodeLimits(max_turns=5, max_tokens=4000))
    (trajectory,) = engine.run(CalcEnv().tasks("train", 1, seed=3))
    episode = trajectory.episode
    assert episode.count("invalid_call") == 3
    assert episode.count("tool_call") == 0
    tool_texts = [m.content for m in episode.messages if m.role == "tool"]
    assert "JSON" in tool_texts[0]
    assert "search" in tool_texts[1]
    assert "expr" in tool_texts[2]
    assert not episode.truncated


def test_budgets_truncate_and_say_so():
    encode, decode = char_codec()
    engine = scripted_engine({0: [GOOD, GOOD, GOOD]}, encode, decode, EpisodeLimits(max_turns=2, max_tokens=4000))
    (trajectory,) = engine.run(CalcEnv().tasks("train", 1, seed=3))
    assert trajectory.episode.truncated
    assert trajectory.episode.events[-1].detail == "max_turns"

    engine = scripted_engine({0: [GOOD]}, encode, decode, EpisodeLimits(max_turn_tokens=10, max_tokens=4000))
    (trajectory,) = engine.run(CalcEnv().tasks("train", 1, seed=3))
    assert trajectory.episode.truncated and trajectory.response_len == 10


def test_rollout_logprobs_match_trainer_recompute_on_multi_turn(smoke_run):
    """DESIGN contract 1: the trainer's logprobs on an unchanged model equal the rollout's."""
    policy = PolicyModel.load(smoke_run / "sft" / "final")
    model = policy.model
    backend = HFBackend(model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    engine = RolloutEngine(CalcEnv(), policy.chat, policy.encode, policy.decode, backend, EpisodeLimits())
    tasks = [t for t in CalcEnv().tasks("eval", 16, seed=5) for _ in range(4)]
    trajectories = engine.run(tasks)
    multi = [t for t in trajectories if len(t.turn_spans) >= 2]
    assert len(multi) >= 4, "the SFT model should call the tool in some episodes"
    batch = collate(trajectories, policy.pad_id)
    with torch.no_grad():
        recomputed, _ = forward_logprobs(model, batch)
    mask = batch.loss_mask.bool()
    ratio = (recomputed[mask] - batch.old_logprobs[mask]).exp()
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), float((ratio - 1).abs().max())


def test_branched_episodes_keep_contract_one(smoke_run):
    """Continuations of multi-turn episodes after their first turn (rollout/branch.py): the trainer's
    log-probs, through the shared-prompt path that runs each prefix once, equal the sampler's."""
    from toolpolicy.rollout.branch import Branch
    from toolpolicy.trainer.batch import SHARED_PROMPTS

    policy = PolicyModel.load(smoke_run / "sft" / "final")
    backend = HFBackend(policy.model, policy.stop_ids, policy.pad_id, torch.Generator().manual_seed(0), temperature=1.0)
    engine = RolloutEngine(CalcEnv(), policy.chat, policy.encode, policy.decode, backend, EpisodeLimits())
    parents = [t for t in engine.run([t for t in CalcEnv().tasks("eval", 16, seed=5) for _ in range(2)]) if len(t.turn_spans) >= 2]
    assert len(parents) >= 3, "the SFT model should call the tool in some episodes"
    branches = [Branch(t, 1) for t in parents[:3] for _ in range(2)]
    children = engine.run([b.trajectory.episode.task for b in branches], branches=branches)
    assert all(c.token_ids[: b.cut] == b.trajectory.token_ids[: b.cut] and c.sampled_tokens > 0 for b, c in zip(branches, children))
    assert all(c.prompt_len == b.cut and sum(c.loss_mask[: b.cut]) == 0 for b, c in zip(branches, children))
    batch = collate(children, policy.pad_id)
    with torch.no_grad():
        recomputed, _ = SHARED_PROMPTS.logprobs(policy.model, batch, 1.0)
    mask = batch.loss_mask.bool()
    assert torch.allclose(recomputed[mask], batch.old_logprobs[mask], atol=1e-4), float((recomputed[mask] - batch.old_logprobs[mask]).abs().max())


def test_gate_denial_becomes_an_observation_and_the_tool_never_runs(tmp_path):
    from toolpolicy.gate import AuditLog, Gate, Policy, verify

    policy = Policy.from_dict(
        {
            "default": "allow",
            "rules": [
                {"id": "no-powers", "effect": "forbid", "tools": ["calculator"], "when": 'args.expression.contains("**")',
                 "reason": "powers are not allowed", "hint": "multiply instead"}
            ],
        },
        "test-policy",
    )
    env = CalcEnv()
    log = tmp_path / "audit.jsonl"
    gate = Gate(policy, env.tools, audit=AuditLog(log))
    encode, decode = char_codec()
    power = Message("assistant", "", (ToolCall("calculator", {"expression": "2 ** 10"}),))
    backend = ScriptedBackend({0: [power, GOOD, ANSWER]}, TEMPLATE.render_assistant, encode)
    engine = RolloutEngine(env, TEMPLATE, encode, decode, backend, EpisodeLimits(max_tokens=4000, max_turn_tokens=400), gate)
    (trajectory,) = engine.run(env.tasks("train", 1, seed=3))
    episode = trajectory.episode
    denial, result = [m.content for m in episode.messages if m.role == "tool"]
    assert "no-powers" in denial and "powers are not allowed" in denial and "1024" not in denial
    assert result == "84"
    assert [e.kind for e in episode.events] == ["gate_deny", "tool_call"]
    assert verify(log).ok and verify(log).records == 2


@pytest.mark.parametrize("enforce", [True, False])
def test_a_gate_fault_is_an_infrastructure_error_never_the_models_violation(enforce: bool, monkeypatch):
    """A gate that fails inside itself denies (fails closed), and the decision says it was the
    gate's fault: the episode ends as an infrastructure error, with no denial or violation for
    the rewards to charge to the model, in shadow mode too (the call does not run then either)."""
    env = CalcEnv()
    gate = Gate(Policy.from_dict({"default": "allow"}, "allow-all"), env.tools, enforce=enforce)

    def broken(call, ledger):
        raise RuntimeError("the policy store went away")

    monkeypatch.setattr(gate, "_evaluate", broken)
    decision = gate.evaluate(GOOD.tool_calls[0])
    assert (decision.effect, decision.outcome) == ("deny", "gate_error") and "went away" in decision.reason
    encode, decode = char_codec()
    backend = ScriptedBackend({0: [GOOD, ANSWER]}, TEMPLATE.render_assistant, encode)
    engine = RolloutEngine(env, TEMPLATE, encode, decode, backend, EpisodeLimits(max_tokens=4000, max_turn_tokens=400), gate)
    (trajectory,) = engine.run(env.tasks("train", 1, seed=3))
    episode = trajectory.episode
    assert episode.infra_error is not None and "policy gate" in episode.infra_error
    assert not [e for e in episode.events if e.kind in ("gate_deny", "violation", "tool_call")]
    assert policy_violation(episode) == 0.0


def test_decisions_say_what_kind_of_outcome_they_are():
    policy = Policy.from_dict({"default": "deny", "rules": [
        {"id": "small", "effect": "permit", "tools": ["calculator"], "when": "size(args.expression) < 20"},
    ]}, "p")
    gate = Gate(policy, CalcEnv().tools)
    outcomes = {
        "allowed": ToolCall("calculator", {"expression": "1 + 1"}),
        "denied": ToolCall("calculator", {"expression": "1 + 1 + 1 + 1 + 1 + 1 + 1 + 1"}),
        "malformed": ToolCall("calculator", {"expr": "1 + 1"}),
        "unknown_tool": ToolCall("search", {"query": "x"}),
    }
    assert {kind: gate.evaluate(call).outcome for kind, call in outcomes.items()} == {kind: kind for kind in outcomes}


def test_tool_facts_reach_the_ledger_and_the_policy_reads_them():
    """A tool records `user_verified`; a rule that needs it denies the refund before, allows it after."""
    refunds: list[int] = []

    @tool
    def verify_identity(code: str) -> ToolResult:
        """Check the guest's security code.

        Args:
            code: The code the guest gave.
        """
        ok = code == "1234"
        return ToolResult("verified" if ok else "wrong code", facts={"user_verified": True} if ok else {})

    @tool
    def refund(amount: int) -> str:
        """Refund the guest.

        Args:
            amount: Amount in euros.
        """
        refunds.append(amount)
        return f"refunded {amount}"

    @dataclass
    class Desk:
        name: str = "desk"
        tools: ToolSet = field(default_factory=lambda: ToolSet([verify_identity, refund]))
        system_prompt: str = "You are a hotel desk."
        default_rewards: dict = field(default_factory=lambda: {"policy_violation": -1.0})

        def tasks(self, split, n, seed):
            return [Task(f"t{i}", "Refund me 20", "20") for i in range(n)]

        def initial_messages(self, task):
            return [Message("system", self.system_prompt), Message("user", task.prompt)]

        def on_answer(self, task, messages):
            return None

    policy = Policy.from_dict(
        {"default": "allow", "rules": [{"id": "verify-first", "effect": "forbid", "tools": ["refund"],
                                        "when": '!("user_verified" in state) || !state.user_verified',
                                        "reason": "identity not verified", "hint": "call verify_identity first"}]},
        "desk-policy",
    )
    env = Desk()
    encode, decode = char_codec()
    turns = [
        Message("assistant", "", (ToolCall("refund", {"amount": 20}),)),
        Message("assistant", "", (ToolCall("verify_identity", {"code": "0000"}),)),
        Message("assistant", "", (ToolCall("refund", {"amount": 20}),)),
        Message("assistant", "", (ToolCall("verify_identity", {"code": "1234"}),)),
        Message("assistant", "", (ToolCall("refund", {"amount": 20}),)),
        Message("assistant", "Done. Answer: 20"),
    ]
    backend = ScriptedBackend({0: turns}, TEMPLATE.render_assistant, encode)
    limits = EpisodeLimits(max_turns=8, max_tokens=4000, max_turn_tokens=400)
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, limits, Gate(policy, env.tools)) as engine:
        (trajectory,) = engine.run(env.tasks("train", 1, 0))
    episode = trajectory.episode
    observations = [m.content for m in episode.messages if m.role == "tool"]
    assert "verify-first" in observations[0] and "identity not verified" in observations[0]
    assert "verify-first" in observations[2]  # a wrong code records no fact
    assert observations[4] == "refunded 20"
    assert refunds == [20]
    assert [e.kind for e in episode.events] == ["gate_deny", "tool_call", "gate_deny", "tool_call", "tool_call"]
    assert policy_violation(episode) == 2.0
    assert episode.denials_by_rule() == {"verify-first": 2}
    summary = summarize([ScoredEpisode.from_episode(episode, True, 10), ScoredEpisode.from_episode(episode, True, 10)])
    assert summary["denials_per_episode"] == 2.0
    assert summary["denials_by_rule"] == {"verify-first": 2.0}


def test_each_episode_gets_its_own_session_and_its_outcome():
    """An env with `session(task)`: per-episode tools, user replies, and finish() -> Episode.outcome."""

    class Counter:
        def __init__(self, task):
            self.hits = 0

            @tool
            def bump() -> str:
                """Add one to this episode's counter."""
                self.hits += 1
                return str(self.hits)

            self.tools = ToolSet([bump])
            self.task = task

        def on_answer(self, messages):
            if self.task.id == "t0" and sum(m.role == "user" for m in messages) == 1:
                return [Message("user", "Are you sure?")]
            return None

        def finish(self):
            if self.task.id == "t2":
                raise RuntimeError("database copy vanished")
            return {"hits": self.hits}

    class CounterEnv:
        name = "counter"
        system_prompt = "Count."
        default_rewards = {}

        def __init__(self):
            self.tools = Counter(Task("spec", "", "")).tools

        def tasks(self, split, n, seed):
            return [Task(f"t{i}", "count", "") for i in range(n)]

        def initial_messages(self, task):
            return [Message("system", self.system_prompt), Message("user", task.prompt)]

        def on_answer(self, task, messages):
            raise AssertionError("the session answers, not the env")

        def session(self, task):
            return Counter(task)

    bump = Message("assistant", "", (ToolCall("bump", {}),))
    encode, decode = char_codec()
    scripts = {0: [bump, bump, Message("assistant", "two"), Message("assistant", "yes")], 1: [bump, Message("assistant", "one")],
               2: [Message("assistant", "none")]}
    backend = ScriptedBackend(scripts, TEMPLATE.render_assistant, encode)
    limits = EpisodeLimits(max_turns=8, max_tokens=4000, max_turn_tokens=400)
    env = CounterEnv()
    seen = []  # what the progress figures saw after each turn: (task, outcome) of the ended episodes

    def figures(ended):
        seen.append([(e.task.id, dict(e.outcome)) for e in ended])
        return {}

    with RolloutEngine(env, TEMPLATE, encode, decode, backend, limits) as engine:
        first, second, third = engine.run(env.tasks("train", 3, 0), progress="test", figures=figures)
    # Each session is finished as its episode ends, so the bar's figures can score it.
    assert seen[:2] == [[("t2", {})], [("t2", {}), ("t1", {"hits": 1})]]
    assert seen[-1][-1] == ("t0", {"hits": 2})
    assert first.episode.outcome == {"hits": 2} and second.episode.outcome == {"hits": 1}
    assert [m.content for m in first.episode.messages if m.role == "user"] == ["count", "Are you sure?"]
    assert first.episode.messages[-1].content == "yes"
    assert third.episode.outcome == {} and "database copy vanished" in third.episode.infra_error
    assert first.episode.to_dict()["outcome"] == {"hits": 2}


# ---- contracts 1 and 2 on the shipped BPE tokenizers ------------------------------------
#
# A one-character-per-token codec cannot tell "kept the sampled ids" from "decoded and
# re-tokenized them": both give the same ids. A real BPE can. These tests use the
# tokenizers of the shipped checkpoints (trained on calc and hotel text).

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"


@pytest.fixture(scope="module")
def calc_bpe():
    return AutoTokenizer.from_pretrained(CHECKPOINTS / "calc-sft")


@pytest.fixture(scope="module")
def hotel_bpe():
    return AutoTokenizer.from_pretrained(CHECKPOINTS / "hotel-sft")


class ReplayIds:
    """A backend that "samples" fixed token ids with made-up log-probs (one episode),
    and keeps every request so a test can see what it was asked to continue."""

    def __init__(self, turns: list[tuple[list[int], list[float]]]) -> None:
        self.turns = list(turns)
        self.requests: list[list[int]] = []  # the prefix of each request, copied when asked

    def generate(self, requests: list[GenRequest]) -> list[Generation]:
        self.requests.extend(list(r.ids) for r in requests)
        return [Generation(*self.turns.pop(0), finished=True) for _ in requests]

    def forget(self) -> None:
        """Nothing is kept between turns."""

    def close(self) -> None:
        """Nothing to release."""


def unmerged_split(tokenizer, word: str) -> tuple[int, int]:
    """Two vocabulary ids whose texts concatenate to `word`, a word the tokenizer itself
    encodes as one other id: a split it never produces, but a model may sample."""
    encode, decode = codec(tokenizer)
    (merged,) = encode(word)
    by_text = {decode([i]): i for i in range(len(tokenizer))}
    for k in range(1, len(word)):
        a, b = by_text.get(word[:k]), by_text.get(word[k:])
        if a is not None and b is not None and merged not in (a, b):
            return a, b
    raise AssertionError(f"no two-token split of {word!r} in this vocabulary")


def with_split(tokenizer, text: str, word: str) -> list[int]:
    """`text` tokenized, except that `word` is the two ids of `unmerged_split`."""
    encode, _ = codec(tokenizer)
    i = text.index(word)
    return encode(text[:i]) + list(unmerged_split(tokenizer, word)) + encode(text[i + len(word) :])


def test_sampled_ids_survive_unchanged_on_a_real_bpe(calc_bpe):
    """Contract 1 with a split the tokenizer never makes ("calculato"+"r", "Ans"+"wer"):
    the ids stay as sampled through the engine (across an observation) and collate."""
    encode, decode = codec(calc_bpe)
    call_ids = with_split(calc_bpe, TEMPLATE.render_assistant(GOOD), "calculator")
    answer_ids = with_split(calc_bpe, TEMPLATE.render_assistant(ANSWER), "Answer")
    for ids, message in ((call_ids, GOOD), (answer_ids, ANSWER)):
        assert decode(ids) == TEMPLATE.render_assistant(message)
        assert encode(decode(ids)) != ids, "re-tokenizing must differ, or this test proves nothing"
    call_logp = [-0.01 * (k + 1) for k in range(len(call_ids))]
    answer_logp = [-1.5 - 0.02 * k for k in range(len(answer_ids))]
    backend = ReplayIds([(call_ids, call_logp), (answer_ids, answer_logp)])
    env = CalcEnv()
    engine = RolloutEngine(env, TEMPLATE, encode, decode, backend, EpisodeLimits(max_tokens=4000, max_turn_tokens=400))
    (trajectory,) = engine.run(env.tasks("train", 1, seed=3))

    # The turns were understood: the split call ran, the split answer ended the episode.
    episode = trajectory.episode
    assert [m.role for m in episode.messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert episode.messages[3].content == "84" and episode.messages[4].content == "Answer: 84"

    ids, mask, logp, p = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs, trajectory.prompt_len
    prompt = encode(TEMPLATE.render_prompt(env.initial_messages(episode.task), env.tools.specs()))
    assert ids[:p] == prompt
    first = (p, p + len(call_ids))
    second = (len(ids) - len(answer_ids), len(ids))
    assert trajectory.turn_spans == [first, second]
    for (start, end), turn, turn_logp in ((first, call_ids, call_logp), (second, answer_ids, answer_logp)):
        assert ids[start:end] == turn
        assert mask[start:end] == [1] * len(turn)
        assert logp[start:end] == turn_logp
    # Between the turns: only the new observation, tokenized on its own with the template's framing.
    assert ids[first[1] : second[0]] == encode(TEMPLATE.render_observation([episode.messages[3]]))
    assert decode(ids) == TEMPLATE.render(episode.messages, env.tools.specs()).removesuffix("\n")
    assert encode(decode(ids)) != ids
    # The second turn continued from the sampled ids, not from a re-tokenized history.
    assert backend.requests == [prompt, ids[: second[0]]]
    assert backend.requests[1][first[0] : first[1]] == call_ids

    batch = collate([trajectory], calc_bpe.pad_token_id)
    assert batch.input_ids[0].tolist() == ids
    for (start, end), turn, turn_logp in ((first, call_ids, call_logp), (second, answer_ids, answer_logp)):
        # Position t predicts token t + 1: the turn's targets sit one to the left.
        assert batch.targets[0, start - 1 : end - 1].tolist() == turn
        assert batch.loss_mask[0, start - 1 : end - 1].tolist() == [1.0] * len(turn)
        assert torch.equal(batch.old_logprobs[0, start - 1 : end - 1], torch.tensor(turn_logp, dtype=torch.float32))
    assert int(batch.loss_mask.sum()) == len(call_ids) + len(answer_ids)


def test_padding_is_never_a_sampled_target(calc_bpe):
    """Contract 2 on padding: two trajectories of different lengths, both ending on a sampled token."""
    encode, decode = codec(calc_bpe)
    backend = ScriptedBackend({0: [GOOD, ANSWER], 1: [ANSWER]}, TEMPLATE.render_assistant, encode)
    engine = RolloutEngine(CalcEnv(), TEMPLATE, encode, decode, backend, EpisodeLimits(max_tokens=4000, max_turn_tokens=400))
    long, short = engine.run(CalcEnv().tasks("train", 1, seed=3) * 2)
    assert len(long.token_ids) > len(short.token_ids)
    assert long.loss_mask[-1] == short.loss_mask[-1] == 1  # the padding starts right after a sampled token
    pad = calc_bpe.pad_token_id
    batch = collate([long, short], pad)
    width = batch.input_ids.shape[1]
    assert width == len(long.token_ids)
    for row, trajectory in enumerate((long, short)):
        n = len(trajectory.token_ids)
        assert batch.input_ids[row, :n].tolist() == trajectory.token_ids
        assert batch.input_ids[row, n:].tolist() == [pad] * (width - n)
        assert batch.attention[row].tolist() == [1] * n + [0] * (width - n)
        # Targets 0..n-2 are real tokens; from n-1 on every target is padding.
        assert batch.loss_mask[row].tolist() == [float(m) for m in trajectory.loss_mask[1:]] + [0.0] * (width - n)
        assert batch.old_logprobs[row, n - 1 :].abs().sum() == 0
    assert width - len(short.token_ids) > 0
    target_is_padding = batch.attention[:, 1:] == 0  # [B, L-1]
    assert int(target_is_padding.sum()) == width - len(short.token_ids)
    assert not bool((batch.loss_mask.bool() & target_is_padding).any())


def test_gate_denial_observation_has_loss_mask_zero(calc_bpe):
    """Contract 2 on gate messages: the denial the model reads is never trained on."""
    policy = Policy.from_dict(
        {"default": "allow", "rules": [{"id": "no-powers", "effect": "forbid", "tools": ["calculator"],
                                        "when": 'args.expression.contains("**")', "reason": "powers are not allowed",
                                        "hint": "multiply instead"}]},
        "test-policy",
    )
    env = CalcEnv()
    encode, decode = codec(calc_bpe)
    power = Message("assistant", "", (ToolCall("calculator", {"expression": "2 ** 10"}),))
    backend = ScriptedBackend({0: [power, GOOD, ANSWER]}, TEMPLATE.render_assistant, encode)
    limits = EpisodeLimits(max_tokens=4000, max_turn_tokens=400)
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, limits, Gate(policy, env.tools)) as engine:
        (trajectory,) = engine.run(env.tasks("train", 1, seed=3))
    episode = trajectory.episode
    assert [e.kind for e in episode.events] == ["gate_deny", "tool_call"]
    denial = episode.messages[3]
    assert denial.role == "tool" and "no-powers" in denial.content

    # Lay the tokens out from the template, not from what the engine reports.
    ids, mask, logp = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
    p = len(encode(TEMPLATE.render_prompt(env.initial_messages(episode.task), env.tools.specs())))
    turn = encode(TEMPLATE.render_assistant(power))
    observation = encode(TEMPLATE.render_observation([denial]))
    start, end = p + len(turn), p + len(turn) + len(observation)
    assert trajectory.prompt_len == p and ids[p:start] == turn and ids[start:end] == observation
    assert ids[end : end + len(encode(TEMPLATE.render_assistant(GOOD)))] == encode(TEMPLATE.render_assistant(GOOD))
    text = decode(ids[start:end])
    assert "<tool_response>" in text and "rule no-powers" in text and "powers are not allowed" in text

    assert mask[:p] == [0] * p
    assert mask[p:start] == [1] * len(turn)
    assert mask[start:end] == [0] * len(observation)
    assert logp[start:end] == [0.0] * len(observation)
    assert trajectory.turn_spans[:2] == [(p, start), (end, end + len(encode(TEMPLATE.render_assistant(GOOD))))]


def test_simulated_user_turn_has_loss_mask_zero(hotel_bpe):
    """Contract 2 on user-simulator turns: the hotel guest answers a question; that answer,
    like the prompt and the tool output, has mask 0; the desk's turns around it have mask 1."""
    from toolpolicy.envs.hotel import HotelEnv
    from toolpolicy.envs.hotel.tasks import ASK_IDENTITY

    env = HotelEnv()
    task = next(t for t in env.tasks("train", 100, seed=1) if t.info["identity"] == "asked")
    info = task.info
    ask = Message("assistant", ASK_IDENTITY)
    verify = Message("assistant", "", (ToolCall("verify", {"guest": info["guest"], "surname": info["last_name"],
                                                          "year": info["birth_year"]}),))
    bye = Message("assistant", "Thank you, you are verified.")
    encode, decode = codec(hotel_bpe)
    backend = ScriptedBackend({0: [ask, verify, bye]}, TEMPLATE.render_assistant, encode)
    limits = EpisodeLimits(max_turns=8, max_tokens=4000, max_turn_tokens=400)
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, limits) as engine:
        (trajectory,) = engine.run([task])
    episode = trajectory.episode
    assert [m.role for m in episode.messages] == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]
    reply, tool_result = episode.messages[3], episode.messages[5]
    assert reply.content == f"{info['guest']}, {info['last_name']}, {info['birth_year']}."

    # Expected layout from the template: prompt, ask, guest reply, verify call, tool result, bye.
    prompt = encode(TEMPLATE.render_prompt(env.initial_messages(task), env.tools.specs()))
    pieces = [
        (prompt, 0),
        (encode(TEMPLATE.render_assistant(ask)), 1),
        (encode(TEMPLATE.render_observation([reply])), 0),
        (encode(TEMPLATE.render_assistant(verify)), 1),
        (encode(TEMPLATE.render_observation([tool_result])), 0),
        (encode(TEMPLATE.render_assistant(bye)), 1),
    ]
    assert trajectory.token_ids == [i for ids, _ in pieces for i in ids]
    assert trajectory.loss_mask == [m for ids, m in pieces for _ in ids]
    user_start = len(pieces[0][0]) + len(pieces[1][0])
    user_turn = trajectory.token_ids[user_start : user_start + len(pieces[2][0])]
    assert f"<|im_start|>user\n{reply.content}<|im_end|>" in decode(user_turn)
    assert trajectory.loss_mask[user_start : user_start + len(user_turn)] == [0] * len(user_turn)
    assert trajectory.loss_mask[user_start - 1] == 1 and trajectory.loss_mask[user_start + len(user_turn)] == 1
    assert trajectory.prompt_len == len(prompt) and sum(trajectory.loss_mask[: len(prompt)]) == 0
