"""bfcl_multi_turn: BFCL v4's multi-turn entries on their own backends, scored as BFCL scores them."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from toolpolicy.envs import make_env
from toolpolicy.envs.bfcl import CATEGORIES, BfclMultiTurnEnv, load_entries, split_of
from toolpolicy.envs.bfcl.env import MORE_FUNCTIONS
from toolpolicy.gate import Gate, Ledger, Policy
from toolpolicy.model import char_codec, make_template
from toolpolicy.rollout import EpisodeLimits, RolloutEngine, ScriptedBackend
from toolpolicy.types import Episode, Message, Task, ToolCall

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by `make test` (pip install --no-deps bfcl-eval)")

REPO = Path(__file__).resolve().parents[1]
POLICY = REPO / "examples" / "policies" / "bfcl_multi_turn.yaml"
TEMPLATE = make_template(compact=True)
WIDE = EpisodeLimits(max_turns=40, max_tokens=10**7, max_turn_tokens=10**6, max_call_chars=10**5)  # long_context posts long texts


@pytest.fixture(scope="module")
def env() -> BfclMultiTurnEnv:
    return BfclMultiTurnEnv()


def run(env: BfclMultiTurnEnv, tasks: list[Task], scripts: list[list[Message]], gate: Gate | None = None,
        limits: EpisodeLimits = WIDE) -> list[Episode]:
    """Scripted assistant turns through the real engine (tools, gate, sessions)."""
    encode, decode = char_codec()
    backend = ScriptedBackend(dict(enumerate(scripts)), TEMPLATE.render_assistant, encode)
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, limits, gate) as engine:
        return [t.episode for t in engine.run(tasks)]


def replay(env: BfclMultiTurnEnv, tasks: list[Task], gate: Gate | None = None) -> list[Episode]:
    return run(env, tasks, [env.expert_turns(task, random.Random(0)) for task in tasks], gate)


def test_ground_truth_replay_scores_100_and_the_policy_denies_none_of_it(env):
    """Every entry of the base category: the possible answers' calls through the tool path and
    the shipped policy's gate (shadow mode, so a denial would be counted and still run).
    bench/bfcl_multi_turn_replay.py replays all four categories."""
    tasks = [env.task(entry_id) for entry_id in sorted(env.entries) if entry_id.startswith("multi_turn_base_")]
    assert len(tasks) == 200
    gate = Gate(Policy.load(POLICY), env.tools, enforce=False)
    episodes = replay(env, tasks, gate)
    failed = [(e.task.id, e.outcome.get("bfcl_error"), e.outcome.get("bfcl_detail")) for e in episodes
              if not e.outcome.get("goal_reached")]
    assert failed == []
    denied = [(e.task.id, e.denials_by_rule()) for e in episodes if e.denials_by_rule()]
    assert denied == []  # each would be a false positive of the policy
    assert all(e.infra_error is None and not e.truncated and e.count("invalid_call") == 0 for e in episodes)


def entry_task(env: BfclMultiTurnEnv, entry_id: str) -> Task:
    return env.task(entry_id)


def test_a_wrong_argument_fails_the_state_check(env):
    task = entry_task(env, "multi_turn_base_0")
    script = env.expert_turns(task, random.Random(0))
    first = script[0].tool_calls  # cd document, mkdir temp, mv final_report.pdf temp
    wrong = (*first[:2], ToolCall("mv", {"source": "previous_report.pdf", "destination": "temp"}))
    script[0] = Message("assistant", "", wrong)
    [episode] = run(env, [task], [script])
    assert not episode.outcome["goal_reached"]
    assert episode.outcome["bfcl_error"] == "multi_turn:instance_state_mismatch"


def test_a_skipped_read_fails_the_response_check_and_a_silent_turn_the_empty_check(env):
    task = entry_task(env, "multi_turn_base_0")
    script = env.expert_turns(task, random.Random(0))
    cd, _grep = script[2].tool_calls  # turn 1: cd temp, grep the report
    without_read = [*script[:2], Message("assistant", "", (cd,)), *script[3:]]
    silent = [Message("assistant", "Nothing to do."), *script[2:]]  # turn 0 answered without a call
    skipped, mute = run(env, [task, task], [without_read, silent])
    assert skipped.outcome["bfcl_error"] == "multi_turn:execution_response_mismatch"
    assert mute.outcome["bfcl_error"] == "multi_turn:empty_turn_model_response"


def test_an_episode_cut_before_its_last_turn_fails(env):
    task = entry_task(env, "multi_turn_base_0")
    [episode] = run(env, [task], [env.expert_turns(task, random.Random(0))], limits=EpisodeLimits(3, 10**7, 10**6))
    assert episode.truncated and episode.outcome["bfcl_error"] == "multi_turn:force_terminated"
    assert episode.outcome["turns_completed"] < episode.outcome["turns"]


def test_withheld_functions_arrive_on_their_turn(env):
    """miss_func: the withheld function is not listed until its turn, whose user message shows
    its doc and BFCL's line; as in BFCL, the backend still runs a call to it."""
    task = entry_task(env, "multi_turn_miss_func_0")  # 'sort' withheld until turn 3
    assert "sort" not in {spec.name for spec in env.task_specs(task)}
    session = env.session(task)
    for _ in range(2):
        assert session.on_answer([])[0].content == env.entries[task.id].turns[session.turn]
    [added] = session.on_answer([])
    assert added.content.endswith(MORE_FUNCTIONS) and '"name": "sort"' in added.content
    assert session.tools.call(ToolCall("sort", {"file_name": "final_report.pdf"})).ok


def test_calls_are_checked_by_argument_names_and_a_backend_error_is_the_models(env):
    session = env.session(entry_task(env, "multi_turn_base_0"))
    assert session.tools.call(ToolCall("cd", {"dir": "document"})).error == "invalid_arguments"
    result = session.tools.call(ToolCall("cd", {"folder": "nowhere"}))
    assert result.ok and "No such file or directory" in result.content  # BFCL returns it as the result
    session.tools.call(ToolCall("cd", {"folder": "document"}))
    raised = session.tools.call(ToolCall("tail", {"file_name": "final_report.pdf", "lines": "ten"}))
    assert raised.error == "tool_error" and raised.content.startswith("Error during execution")


def test_split_is_fixed_and_never_shares_a_conversation(env):
    train, held = env.tasks("train", 2000, seed=0), env.tasks("eval", 500, seed=0)
    train_ids, eval_ids = {t.id for t in train}, {t.id for t in held}
    assert not train_ids & eval_ids and len(train_ids | eval_ids) == 800
    number = lambda entry_id: entry_id.rsplit("_", 1)[-1]  # noqa: E731
    assert not {number(i) for i in train_ids} & {number(i) for i in eval_ids}  # variants stay together
    assert [t.id for t in env.tasks("eval", 30, seed=4)] == [t.id for t in env.tasks("eval", 30, seed=4)]
    assert [t.id for t in env.tasks("eval", 30, seed=4)] != [t.id for t in env.tasks("eval", 30, seed=5)]
    assert 0.1 < len({number(i) for i in eval_ids}) / 200 < 0.3
    assert all(split_of(t.id) == "eval" for t in held)


def test_policy_denies_deletions_out_of_folder_big_orders_and_strangers(env):
    gate = Gate(Policy.load(POLICY), env.tools)
    ledger = Ledger()

    def denied(name: str, **arguments) -> bool:
        return not gate.evaluate(ToolCall(name, arguments), ledger).allowed

    assert denied("rm", file_name="../notes.txt") and denied("rm", file_name="*") and not denied("rm", file_name="notes.txt")
    assert denied("rmdir", dir_name="..") and denied("mv", source="a.txt", destination="/tmp")
    assert denied("place_order", order_type="Buy", symbol="AAPL", price=500.0, amount=1000)
    assert not denied("place_order", order_type="Buy", symbol="AAPL", price=227.16, amount=100)
    assert denied("place_order", order_type="Buy", symbol="AAPL", price="lots", amount=1)  # fails closed
    ledger.learn({"contacts": ["USR001", "USR002"]})
    assert not denied("send_message", receiver_id="USR002", message="hi") and denied("send_message", receiver_id="USR999", message="hi")


def test_registered_with_the_demonstrator_and_the_data_is_all_there():
    assert isinstance(make_env("bfcl_multi_turn"), BfclMultiTurnEnv)
    assert {c: len(load_entries(c)) for c in CATEGORIES} == dict.fromkeys(CATEGORIES, 200)


SMOKE = REPO / "src" / "toolpolicy" / "configs" / "bfcl_multi_turn_smoke.yaml"


def test_cli_sft_rl_and_eval_steps_with_a_tiny_model(tmp_path: Path) -> None:
    """SFT on ground-truth replays, an RL step and an evaluation with the gate off and on."""
    from toolpolicy.cli import main

    run_dir = ["--set", f"run.dir={tmp_path}"]
    assert main(["sft", str(SMOKE), *run_dir]) == 0
    assert main(["train", str(SMOKE), *run_dir, "--set", f"rl.init_from={tmp_path / 'sft' / 'final'}"]) == 0
    assert main(["eval", str(SMOKE), *run_dir, "--gate", "both"]) == 0
    for name in ("eval-gate-off", "eval-gate-on"):
        summary = json.loads((tmp_path / "eval" / f"{name}.json").read_text())
        assert summary["n"] == 2 and summary["infra_errors"] == 0
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert any(row.get("phase") == "rl" for row in logged)
