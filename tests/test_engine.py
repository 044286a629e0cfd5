"""The rollout engine: token ids are the truth, the mask is exact, bad calls never crash."""

from __future__ import annotations

import random

import pytest
import torch

from toolpolicy.chat import HermesTemplate
from toolpolicy.envs import CalcEnv
from toolpolicy.envs.calc import ExpertStyle
from toolpolicy.model import codec, load_policy, make_template
from toolpolicy.model.embedded import train_tokenizer
from toolpolicy.rollout import HFBackend, Limits, RolloutEngine, ScriptedBackend
from toolpolicy.trainer.batch import collate, forward_logprobs
from toolpolicy.trainer.setup import char_codec
from toolpolicy.types import Message, ToolCall

TEMPLATE = make_template(compact=True)


def scripted_engine(scripts: dict[int, list[Message]], encode, decode, limits: Limits = Limits(max_tokens=4000, max_turn_tokens=400)) -> RolloutEngine:
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
    engine = scripted_engine({0: [BAD_JSON, UNKNOWN, WRONG_ARG, ANSWER]}, encode, decode, Limits(max_turns=5, max_tokens=4000))
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
    engine = scripted_engine({0: [GOOD, GOOD, GOOD]}, encode, decode, Limits(max_turns=2, max_tokens=4000))
    (trajectory,) = engine.run(CalcEnv().tasks("train", 1, seed=3))
    assert trajectory.episode.truncated
    assert trajectory.episode.events[-1].detail == "max_turns"

    engine = scripted_engine({0: [GOOD]}, encode, decode, Limits(max_turn_tokens=10, max_tokens=4000))
    (trajectory,) = engine.run(CalcEnv().tasks("train", 1, seed=3))
    assert trajectory.episode.truncated and trajectory.response_len == 10


def test_rollout_logprobs_match_trainer_recompute_on_multi_turn(smoke_run):
    """DESIGN contract 1: the trainer's logprobs on an unchanged model equal the rollout's."""
    model, tok = load_policy(smoke_run / "sft" / "final")
    encode, decode = codec(tok)
    from toolpolicy.model import pad_id, stop_ids

    backend = HFBackend(model, stop_ids(tok), pad_id(tok), torch.Generator().manual_seed(0), temperature=1.0)
    engine = RolloutEngine(CalcEnv(), TEMPLATE, encode, decode, backend, Limits())
    tasks = [t for t in CalcEnv().tasks("eval", 16, seed=5) for _ in range(4)]
    trajectories = engine.run(tasks)
    multi = [t for t in trajectories if len(t.turn_spans) >= 2]
    assert len(multi) >= 4, "the SFT model should call the tool in some episodes"
    batch = collate(trajectories, pad_id(tok))
    with torch.no_grad():
        recomputed, _ = forward_logprobs(model, batch)
    mask = batch.loss_mask.bool()
    ratio = (recomputed[mask] - batch.old_logprobs[mask]).exp()
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4), float((ratio - 1).abs().max())


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
    engine = RolloutEngine(env, TEMPLATE, encode, decode, backend, Limits(max_tokens=4000, max_turn_tokens=400), gate)
    (trajectory,) = engine.run(env.tasks("train", 1, seed=3))
    episode = trajectory.episode
    denial, result = [m.content for m in episode.messages if m.role == "tool"]
    assert "no-powers" in denial and "powers are not allowed" in denial and "1024" not in denial
    assert result == "84"
    assert [e.kind for e in episode.events] == ["gate_deny", "tool_call"]
    assert verify(log).ok and verify(log).records == 2
