"""The chat-completions path against a real local HTTP server (tests/fixtures/chat_server.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from toolpolicy.envs import CalcEnv
from toolpolicy.eval.metrics import ScoredEpisode, summarize
from toolpolicy.gate import Gate, Policy
from toolpolicy.rewards import correct_answer
from toolpolicy.rollout import EpisodeLimits
from toolpolicy.rollout.chat_endpoint import ChatClient, ChatEngine, Endpoint, EndpointUser, decode_reply
from toolpolicy.types import Message

SERVER = Path(__file__).parent / "fixtures" / "chat_server.py"
KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    env = {**os.environ, "CHAT_SERVER_KEY": KEY}
    process = subprocess.Popen([sys.executable, str(SERVER)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = process.stdout.readline()
        assert line.startswith("PORT "), line
        yield f"http://127.0.0.1:{line.split()[1]}/v1"
    finally:
        process.kill()
        process.wait()


def run(base_url: str, model: str, n: int = 6, gate: Gate | None = None, **endpoint):
    os.environ["TEST_CHAT_KEY"] = KEY
    env = CalcEnv()
    client = ChatClient(Endpoint(base_url, model, api_key_env="TEST_CHAT_KEY", **endpoint))
    try:
        with ChatEngine(env, client, EpisodeLimits(max_turns=4), gate) as engine:
            return engine.run(env.tasks("eval", n, seed=5))
    finally:
        client.close()


def test_a_served_agent_solves_calc_with_the_tool(base_url: str) -> None:
    rollouts = run(base_url, "agent")
    for rollout in rollouts:
        episode = rollout.episode
        assert episode.infra_error is None, episode.infra_error  # the server rejects malformed wire history
        assert correct_answer(episode) == 1.0
        assert [e.kind for e in episode.events] == ["tool_call"]
        assert rollout.completion_tokens > 0
        tool_message = next(m for m in rollout.wire if m["role"] == "tool")
        assert tool_message["tool_call_id"] == rollout.wire[2]["tool_calls"][0]["id"]
    summary = summarize([ScoredEpisode.from_episode(r.episode, True, r.completion_tokens) for r in rollouts])
    assert summary["tool_calls_per_episode"] == 1.0


def test_transient_failures_are_retried(base_url: str) -> None:
    rollouts = run(base_url, "flaky", n=3, retries=3, concurrency=1)
    assert all(r.episode.infra_error is None and correct_answer(r.episode) == 1.0 for r in rollouts)


def test_malformed_arguments_are_an_invalid_call_answered_under_its_id(base_url: str) -> None:
    (rollout,) = run(base_url, "broken-json", n=1)
    episode = rollout.episode
    assert episode.infra_error is None, episode.infra_error
    assert [e.kind for e in episode.events] == ["invalid_call", "tool_call"]
    assert episode.events[0].detail == "bad_json"
    assert correct_answer(episode) == 1.0
    error = next(m for m in rollout.wire if m["role"] == "tool")
    assert error["tool_call_id"] == "call_0" and error["content"].startswith("The arguments of calculator are not valid JSON")


def test_an_endpoint_that_stays_down_is_an_infra_error_not_a_wrong_answer(base_url: str) -> None:
    rollouts = run(base_url, "down", n=2, retries=1)
    assert all("HTTP 500" in r.episode.infra_error for r in rollouts)
    summary = summarize([ScoredEpisode.from_episode(r.episode, False, 0) for r in rollouts])
    assert summary["infra_errors"] == 2 and summary["n"] == 0


def test_the_gate_applies_to_served_models(base_url: str) -> None:
    env = CalcEnv()
    policy = Policy.from_dict(
        {"default": "allow", "rules": [{"id": "no-calculator", "effect": "forbid", "tools": ["calculator"],
                                        "reason": "the calculator is switched off"}]}
    )
    rollouts = run(base_url, "agent", n=2, gate=Gate(policy, env.tools))
    for rollout in rollouts:
        assert [e.kind for e in rollout.episode.events] == ["gate_deny"]
        denial = next(m for m in rollout.wire if m["role"] == "tool")
        assert "no-calculator" in denial["content"] and denial["tool_call_id"]
        assert rollout.episode.denials_by_rule() == {"no-calculator": 1}


def test_a_wrong_key_is_reported_clearly(base_url: str) -> None:
    client = ChatClient(Endpoint(base_url, "agent", api_key_env="TOOLPOLICY_NO_SUCH_KEY"))
    with ChatEngine(CalcEnv(), client, EpisodeLimits()) as engine:
        (rollout,) = engine.run(CalcEnv().tasks("eval", 1, seed=1))
    assert "HTTP 401" in rollout.episode.infra_error and "bad API key" in rollout.episode.infra_error


def test_decode_reply_handles_every_shape_of_call() -> None:
    message = {
        "content": "checking",
        "tool_calls": [
            {"id": "a", "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'}},
            {"id": "b", "function": {"name": "calculator", "arguments": {"expression": "2+2"}}},  # dict, as some servers send
            {"function": {"name": "calculator", "arguments": "[1, 2]"}},
            {"id": "d", "function": {"arguments": "{}"}},
            {"id": "e", "function": {"name": "calculator", "arguments": "x" * 50}},
            "garbage",
        ],
    }
    parsed, wire = decode_reply(message, turn=3, max_call_chars=40)
    assert parsed.content == "checking"
    assert [(c.id, c.arguments) for c in parsed.tool_calls] == [("a", {"expression": "1+1"}), ("b", {"expression": "2+2"})]
    assert [(e.call_id, e.kind) for e in parsed.errors] == [
        ("call_3_2", "not_an_object"), ("d", "missing_name"), ("e", "too_long"), ("call_3_5", "missing_name")
    ]
    assert [w["id"] for w in wire] == ["a", "b", "call_3_2", "d", "e", "call_3_5"]


def test_toolpolicy_eval_scores_a_served_model_with_the_gate_off_and_on(base_url: str, tmp_path: Path, capsys) -> None:
    from toolpolicy.cli import main

    policy = tmp_path / "no-products.yaml"
    policy.write_text(
        "default: allow\nrules:\n  - id: no-products\n    effect: forbid\n    tools: [calculator]\n"
        "    when: args.expression.contains('*')\n    reason: multiply by hand\n"
    )
    os.environ["TEST_CHAT_KEY"] = KEY
    smoke = Path(__file__).parent.parent / "src" / "toolpolicy" / "configs" / "smoke.yaml"
    settings = [f"run.dir={tmp_path / 'run'}", f"eval.served_url={base_url}", "eval.served_model=agent",
                "eval.served_api_key_env=TEST_CHAT_KEY", "eval.tasks=12", f"gate.policy={policy}", "rl.temperature=0"]
    args = ["eval", str(smoke), "--trials", "3", "--gate", "both", *[x for s in settings for x in ("--set", s)]]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "eval-gate-off -> eval-gate-on" in printed and "pass^3" in printed and "violation attempts/episode" in printed
    off = json.loads((tmp_path / "run" / "eval" / "eval-gate-off.json").read_text())
    on = json.loads((tmp_path / "run" / "eval" / "eval-gate-on.json").read_text())
    products = off["violations_per_episode"]
    assert products > 0 and off["denials_per_episode"] == 0 and off["gate"] is False
    assert on["denials_per_episode"] == products and on["violations_per_episode"] == products
    assert off["accuracy"] == 1.0 and on["accuracy"] == pytest.approx(1.0 - products)  # a denied product is answered wrong
    assert set(on["pass_hat_k"]) == {"1", "2", "3"}


def test_a_served_model_can_play_the_user(base_url: str) -> None:
    """EndpointUser sees the conversation from the user's side and ends it with the marker."""
    os.environ["TEST_CHAT_KEY"] = KEY
    client = ChatClient(Endpoint(base_url, "guest", api_key_env="TEST_CHAT_KEY"))
    user = EndpointUser(client, "You are guest G12, Smith, born 1980.", max_replies=2)
    history = [Message("user", "Please cancel my stay."), Message("assistant", "Who are you?")]
    assert user.reply(history) == "G12, Smith, 1980."
    history += [Message("user", "G12, Smith, 1980."), Message("assistant", "Done, it is cancelled.")]
    assert user.reply(history) is None  # nothing asked: the served user ended the conversation
    assert user.left == 0 and user.reply(history + [Message("assistant", "Anything else?")]) is None
    down = EndpointUser(ChatClient(Endpoint(base_url, "down", api_key_env="TEST_CHAT_KEY", retries=0)), "brief")
    assert down.reply(history) is None and "HTTP 500" in down.error
    client.close()


def test_the_served_model_example_config_runs_as_the_readme_says(base_url: str, tmp_path: Path, capsys) -> None:
    """examples/served/calc.yaml with only the server's address, name and key variable changed."""
    from toolpolicy.cli import main

    os.environ["TEST_CHAT_KEY"] = KEY
    config = Path(__file__).parent.parent / "examples" / "served" / "calc.yaml"
    settings = [f"run.dir={tmp_path}", f"eval.served_url={base_url}", "eval.served_model=agent",
                "eval.served_api_key_env=TEST_CHAT_KEY", "eval.tasks=4", "eval.samples=1"]
    cwd = os.getcwd()
    os.chdir(config.parents[2])  # the config names its policy relative to the repository
    try:
        assert main(["eval", str(config), "--gate", "both", *[x for s in settings for x in ("--set", s)]]) == 0
    finally:
        os.chdir(cwd)
    on = json.loads((tmp_path / "eval" / "eval-gate-on.json").read_text())
    assert on["checkpoint"] == "agent" and on["policy"].endswith("calc_policy.yaml") and on["infra_errors"] == 0
    assert on["accuracy"] == 1.0 and "eval-gate-off -> eval-gate-on" in capsys.readouterr().out
