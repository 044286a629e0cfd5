"""SFT from data: chat records read back into the demonstrator's exact tokens, bad records
named by file and line, local Hugging Face datasets, and the tutorial environment through
the CLI alone (SFT from a file, RL, evaluation, a policy file, export)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolpolicy.build import build_env, episode_limits, load_policy_model
from toolpolicy.chat.records import chat_record
from toolpolicy.cli import main
from toolpolicy.build import load_config
from toolpolicy.eval.export import export_episodes
from toolpolicy.rollout import EpisodeLimits
from toolpolicy.rollout.engine import prompt_ids
from toolpolicy.rollout.store import read_step, stored_steps
from toolpolicy.config import ConfigError
from toolpolicy.trainer.demonstrations import demonstrations, demonstrator_dialogue, demonstrator_scripts, within_prompt_budget
from toolpolicy.trainer.groups import draw_tasks, prompt_fits
from toolpolicy.trainer.sft_data import SftDataError, data_examples, load_conversations

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = ROOT / "checkpoints" / "calc-sft"


@pytest.fixture(scope="module")
def calc():
    """The shipped model's chat format, the demo's config and 300 of its demonstrations."""
    cfg = load_config(ROOT / "src/toolpolicy/configs/demo.yaml", ["run.threads=1"])
    policy = load_policy_model(cfg.model, CHECKPOINT)
    demos = demonstrations(cfg, 300, policy.chat, policy.encode, policy.decode, "sft")
    env = build_env(cfg.env)
    scripts = demonstrator_scripts(cfg, env, env.tasks("train", 300, seed=cfg.run.seed), "sft")
    return cfg, policy, demos, scripts


def test_exported_demonstrations_read_back_as_the_very_same_tokens_and_mask(calc, tmp_path):
    cfg, policy, demos, scripts = calc
    assert any(d.episode.truncated for d in demos)  # the budget cuts are part of what must match
    tools = build_env(cfg.env).tools.specs()
    path = tmp_path / "demos.jsonl"
    assert export_episodes(((demonstrator_dialogue(d, s), tools) for d, s in zip(demos, scripts)), path) == len(demos)
    back = data_examples(path, policy.chat, policy.encode, episode_limits(cfg.rollout), build_env(cfg.env))
    assert [t.token_ids for t in back] == [d.token_ids for d in demos]
    assert [t.loss_mask for t in back] == [d.loss_mask for d in demos]
    assert [t.turn_spans for t in back] == [d.turn_spans for d in demos]


def test_sft_keeps_the_examples_whose_prompt_fits_and_says_how_many(calc, capsys):
    _, _, demos, _ = calc
    lengths = sorted({d.prompt_len for d in demos})
    assert len(lengths) > 1  # calc's questions differ in length, so the bound splits them
    most = lengths[len(lengths) // 2]
    kept = within_prompt_budget(demos, most)
    assert kept == [d for d in demos if d.prompt_len <= most] and 0 < len(kept) < len(demos)
    assert f"SFT keeps {len(kept)} of {len(demos)} examples" in capsys.readouterr().out
    assert within_prompt_budget(demos, None) is demos
    with pytest.raises(ConfigError, match=f"max_prompt_tokens.*the shortest has {lengths[0]}"):
        within_prompt_budget(demos, lengths[0] - 1)


def test_rl_draws_only_tasks_whose_prompt_fits_in_place_of_the_others(calc):
    cfg, policy, _, _ = calc
    env = build_env(cfg.env)
    length = lambda task: len(prompt_ids(env, policy.chat, policy.encode, task))  # noqa: E731
    drawn = env.tasks("train", 64, seed=5)
    most = sorted(map(length, drawn))[32]
    fits = prompt_fits(env, policy.chat, policy.encode, most)
    tasks = draw_tasks(env, 16, 5, fits)
    assert len(tasks) == 16 and all(length(t) <= most for t in tasks)
    assert [t.id for t in tasks] == [t.id for t in env.tasks("train", 64, seed=5) if length(t) <= most][:16]
    assert any(length(t) > most for t in env.tasks("train", 16, seed=5))  # the environment's own draw has longer ones
    assert [t.id for t in draw_tasks(env, 16, 5, None)] == [t.id for t in env.tasks("train", 16, seed=5)]
    shortest = min(map(length, env.tasks("train", 16 * 64, seed=5)))
    with pytest.raises(ConfigError, match="max_prompt_tokens"):
        draw_tasks(env, 16, 5, prompt_fits(env, policy.chat, policy.encode, shortest - 1))


def test_tool_results_are_masked_and_assistant_turns_trained(calc, tmp_path):
    cfg, policy, demos, _ = calc
    called = next(d for d in demos if d.episode.count("tool_call") and not d.episode.truncated)
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(chat_record(called.episode.messages, build_env(cfg.env).tools.specs())) + "\n")
    (example,) = data_examples(path, policy.chat, policy.encode, episode_limits(cfg.rollout), build_env(cfg.env))
    runs = [  # the text of each stretch of trained tokens
        policy.decode([i for i, _ in stretch])
        for sampled, stretch in itertools.groupby(zip(example.token_ids, example.loss_mask), key=lambda pair: pair[1])
        if sampled
    ]
    masked = policy.decode([i for i, m in zip(example.token_ids, example.loss_mask) if not m])
    result = next(m.content for m in called.episode.messages if m.role == "tool")
    assert len(runs) == sum(m.role == "assistant" for m in called.episode.messages)  # one per assistant turn
    assert runs[0].startswith("<tool_call>") and runs[-1].startswith("Answer:")
    assert not any("<tool_response>" in run or "<|im_start|>" in run for run in runs)
    assert f"<tool_response>\n{result}" in masked


GOOD = {
    "messages": [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": \"2 + 3\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "assistant", "content": "Answer: 5"},
    ],
    "tools": [{"type": "function", "function": {"name": "calculator", "description": "Evaluate.", "parameters": {"type": "object"}}}],
}


def _with(path: list, value) -> dict:
    record = json.loads(json.dumps(GOOD))
    target = record
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return record


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", r"bad.jsonl:3: not valid JSON"),
        ("[1, 2]", r"bad.jsonl:3: expected a JSON object"),
        (_with(["messages"], None), r"bad.jsonl:3: 'messages' must be a non-empty list"),
        (_with(["messages", 0, "role"], "human"), r"bad.jsonl:3: messages\[0\].role: expected one of system, user, assistant, tool, got 'human'"),
        (_with(["messages", 1, "tool_calls", 0, "function", "arguments"], "{\"expression\": "),
         r"bad.jsonl:3: messages\[1\].tool_calls\[0\].function.arguments: not valid JSON"),
        (_with(["messages", 1, "tool_calls", 0, "function", "arguments"], "[1]"),
         r"messages\[1\].tool_calls\[0\].function.arguments: expected a JSON object, got list"),
        (_with(["messages", 2, "content"], 5), r"bad.jsonl:3: messages\[2\].content: expected a string, got int"),
        (_with(["messages"], [{"role": "user", "content": "hi"}]), r"bad.jsonl:3: no assistant message"),
        (_with(["messages", 2], {"role": "assistant", "content": "x"}), r"bad.jsonl:3: messages\[2\]: two assistant messages in a row"),
        (_with(["tools"], {"calculator": {}}), r"bad.jsonl:3: 'tools' must be a list"),
    ],
)
def test_a_bad_record_stops_the_run_naming_its_file_line_and_field(tmp_path, bad, message):
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(GOOD), "", bad if isinstance(bad, str) else json.dumps(bad), json.dumps(GOOD)]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(SftDataError, match=message):
        load_conversations(path)


def _examples(tmp_path, records: list[dict], env=None):
    """The SFT examples of `records` (lines 1, 2, ... of data.jsonl) against `env` (calc)."""
    from toolpolicy.envs import CalcEnv
    from toolpolicy.model import char_codec, make_template

    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    encode, _ = char_codec()
    return data_examples(path, make_template(compact=True), encode, EpisodeLimits(max_tokens=4000, max_turn_tokens=400), env or CalcEnv())


def _calc_tools() -> list[dict]:
    return [spec.to_openai() for spec in build_env(load_config(ROOT / "src/toolpolicy/configs/demo.yaml").env).tools.specs()]


def test_a_call_to_a_tool_the_record_does_not_offer_stops_the_run_naming_file_line_and_field(tmp_path):
    offered = _with(["tools"], _calc_tools())
    search = {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}}
    bad = _with(["messages", 1, "tool_calls"], [offered["messages"][1]["tool_calls"][0], search])
    bad["tools"] = offered["tools"]
    with pytest.raises(SftDataError, match=r"data.jsonl:2: messages\[1\].tool_calls\[1\].function.name: calls 'search', "
                                           r"a tool the record does not offer \(it offers calculator\)$"):
        _examples(tmp_path, [offered, bad])
    no_tools = _with(["messages", 1, "tool_calls"], [search])
    del no_tools["tools"]  # shown the environment's tools, which do not have it either
    with pytest.raises(SftDataError, match=r"data.jsonl:1: messages\[1\].tool_calls\[0\].function.name: calls 'search'"):
        _examples(tmp_path, [no_tools])


def test_a_record_without_tools_is_shown_the_environments_with_a_one_line_warning(tmp_path, capsys):
    offered = _with(["tools"], _calc_tools())
    bare = _with(["tools"], None)
    examples = _examples(tmp_path, [offered, bare, bare])
    assert examples[1].token_ids == examples[2].token_ids == examples[0].token_ids  # the prompt RL and eval show
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"warning: sft_data: 2 of 3 records have no 'tools' (first: {tmp_path / 'data.jsonl'}:2): they are shown "
                    "the environment's (calculator), as in RL and eval")
    from toolpolicy.envs import CalcEnv

    class PerTaskTools(CalcEnv):  # each task shows its own tools (bfcl): nothing to fill in
        def task_specs(self, task):
            return []

    with pytest.raises(SftDataError, match=r"data.jsonl:2: tools: missing; environment 'calc' shows each task its own tools"):
        _examples(tmp_path, [offered, bare], PerTaskTools())


def test_a_record_whose_tools_differ_from_the_environments_trains_with_a_one_line_warning(tmp_path, capsys):
    offered = _with(["tools"], _calc_tools())
    other = _with(["tools"], [{"type": "function", "function": {"name": "convert", "description": "Convert."}}])
    other["messages"] = other["messages"][:1] + [{"role": "assistant", "content": "Answer: 5"}]
    reworded = _with(["tools"], _calc_tools())
    reworded["tools"][0]["function"]["description"] = "Compute."
    assert len(_examples(tmp_path, [offered, other, reworded, other])) == 4
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (f"warning: sft_data: 3 of 4 records list other tools than the environment's, so their prompts differ "
                    f"from RL's and eval's (first: {tmp_path / 'data.jsonl'}:2: tools: lists convert and lacks calculator "
                    "(the environment's: calculator))")
    _examples(tmp_path, [reworded])
    assert "data.jsonl:1: tools: calculator: description or parameters differ" in capsys.readouterr().err
    _examples(tmp_path, [offered])
    assert capsys.readouterr().err == ""


def test_missing_empty_and_unknown_files_are_errors(tmp_path):
    with pytest.raises(SftDataError, match="does not exist"):
        load_conversations(tmp_path / "nothing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SftDataError, match="holds no records"):
        load_conversations(tmp_path / "empty.jsonl")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(SftDataError, match=r"unknown file type '.csv'"):
        load_conversations(tmp_path / "data.csv")


def test_a_local_datasets_folder_and_parquet_file_read_as_the_jsonl(calc, tmp_path):
    datasets = pytest.importorskip("datasets")
    cfg, policy, demos, scripts = calc
    tools = build_env(cfg.env).tools.specs()
    records = [chat_record(demonstrator_dialogue(d, s), tools) for d, s in list(zip(demos, scripts))[:40]]
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    table = datasets.Dataset.from_list(records)
    table.save_to_disk(str(tmp_path / "folder"))
    datasets.DatasetDict({"train": table}).save_to_disk(str(tmp_path / "splits"))
    table.to_parquet(str(tmp_path / "d.parquet"))
    env = build_env(cfg.env)
    expected = [t.token_ids for t in data_examples(jsonl, policy.chat, policy.encode, episode_limits(cfg.rollout), env)]
    assert expected == [d.token_ids for d in demos[:40]]
    for source in ("folder", "splits", "d.parquet"):
        read = data_examples(tmp_path / source, policy.chat, policy.encode, episode_limits(cfg.rollout), env)
        assert [t.token_ids for t in read] == expected, source
    broken = datasets.Dataset.from_list([{"messages": [{"role": "user", "content": "hi"}]}] * 2)
    broken.save_to_disk(str(tmp_path / "broken"))
    with pytest.raises(SftDataError, match=r"broken: row 0: no assistant message"):
        load_conversations(tmp_path / "broken")


def test_a_conversation_longer_than_the_budget_is_cut_where_a_rollout_would_be(calc, tmp_path):
    cfg, policy, _, _ = calc
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps(GOOD) + "\n")
    env = build_env(cfg.env)
    whole = data_examples(path, policy.chat, policy.encode, EpisodeLimits(max_turns=4, max_tokens=500, max_turn_tokens=100), env)[0]
    one_turn = data_examples(path, policy.chat, policy.encode, EpisodeLimits(max_turns=1, max_tokens=500, max_turn_tokens=100), env)[0]
    assert len(whole.turn_spans) == 2 and not whole.episode.truncated
    assert len(one_turn.turn_spans) == 1 and one_turn.episode.truncated
    assert one_turn.token_ids == whole.token_ids[: len(one_turn.token_ids)]


def test_the_tutorial_environment_trains_and_evaluates_through_the_cli_alone(tmp_path, monkeypatch):
    """examples/adder by import path: SFT from sft.jsonl, RL and evaluation under its policy
    file (`toolpolicy demo` runs the three), its own reward function reported by name, and
    the run's successful episodes exported and read back as SFT data. The tutorial's own
    run takes minutes; this one is cut to 80 SFT steps, 2 RL steps and 8 held-out episodes."""
    run = tmp_path / "adder"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "examples")]), "OMP_NUM_THREADS": "1"}
    short = ["sft.steps=80", "rl.steps=2", "rl.prompts_per_step=2", "rl.group_size=2", "eval.tasks=4", "eval.samples=2"]
    done = subprocess.run(
        [sys.executable, "-m", "toolpolicy", "demo", "--config", "examples/adder/adder.yaml",
         "--set", f"run.dir={run}", "--set", "run.threads=1", "--set", "sft.cold_start=",
         *(arg for kv in short for arg in ("--set", kv))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {row["phase"] for row in rows} == {"sft", "rl"}
    sft_loss = [row["loss"] for row in rows if row["phase"] == "sft"]
    assert len(sft_loss) == 80 and sft_loss[-1] < sft_loss[0] / 4  # from about 5.8 to under 1: the records' format is learnt
    assert (run / "sft" / "final").is_dir() and (run / "rl" / "final").is_dir()
    assert all("rewards/used_add" in row for row in rows if row["phase"] == "rl")
    after = json.loads((run / "eval" / "rl.json").read_text())
    assert set(after["rewards"]) == {"correct_answer", "used_add"}
    assert after["policy"] == "examples/adder/policy.yaml"
    assert "reward used_add" in (run / "report.html").read_text()

    out = tmp_path / "successes.jsonl"
    monkeypatch.syspath_prepend(str(ROOT / "examples"))  # the run's env is adder.adder:Adder
    assert main(["rollouts", "export", str(run), "--to", str(out)]) == 0
    folder = run / "rl" / "rollouts"
    stored = [e.messages for step in stored_steps(folder) for e in read_step(folder, step) if e.success and not e.truncated]
    samples = [json.loads(line) for name in ("sft", "rl") for line in (run / "eval" / f"{name}_samples.jsonl").read_text().splitlines()]
    successes = stored + [s["messages"] for s in samples if s["correct"] and not s["truncated"]]
    exported = load_conversations(out) if successes else []
    assert len(exported) == len(successes)
    for (_, conversation), messages in zip(exported, successes):
        assert [m.to_dict() for m in conversation.messages] == messages
        assert [t.name for t in conversation.tools] == ["add"]


def test_rollouts_export_writes_only_the_successful_episodes_of_a_run(tmp_path):
    folder = tmp_path / "run" / "eval"
    folder.mkdir(parents=True)
    (folder / "rl.config.yaml").write_text("env: calc\n")
    solved = {"role": "assistant", "content": "Answer: 5"}
    samples = [
        {"messages": GOOD["messages"][:1] + [solved], "correct": True, "truncated": False, "events": []},
        {"messages": GOOD["messages"][:1] + [solved], "correct": False, "truncated": False, "events": []},
        {"messages": GOOD["messages"][:1] + [solved], "correct": True, "truncated": True, "events": []},
        {"messages": GOOD["messages"][:1] + [solved], "correct": True, "infra_error": "tool: timeout", "events": []},
        {"messages": GOOD["messages"][:1] + [solved], "correct": True, "events": [{"kind": "gate_deny", "turn": 0}]},
        {"messages": _with(["messages", 1, "tool_calls"], [{"name": "calculator", "arguments": {"expression": "2 + 3"}}])["messages"],
         "correct": True, "truncated": False, "events": [{"kind": "tool_call", "turn": 0}]},  # eval samples keep calls as {name, arguments}
    ]
    (folder / "rl_samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    out = tmp_path / "sft.jsonl"
    assert main(["rollouts", "export", str(tmp_path / "run"), "--to", str(out)]) == 0
    exported = load_conversations(out)
    as_read = [[{**m, "content": m["content"] or ""} for m in samples[i]["messages"]] for i in (0, -1)]  # content null reads as ""
    assert [[m.to_dict() for m in c.messages] for _, c in exported] == as_read
    assert [t.name for t in exported[0][1].tools] == ["calculator"]
    assert main(["rollouts", "export", str(tmp_path / "elsewhere"), "--to", str(out)]) == 2  # no eval samples: an error
