"""env: bfcl: BFCL v4's single-turn entries, one scored assistant turn each, on a split with no leak."""

from __future__ import annotations

import itertools
import json
import random
import re
from dataclasses import replace

import pytest

from toolpolicy.build import build_env
from toolpolicy.build import load_config
from toolpolicy.config import ConfigError
from toolpolicy.envs import make_env
from toolpolicy.envs.bfcl.single_data import CATEGORY_GROUPS, Entry, data_folder, load_v4, shown_functions
from toolpolicy.envs.bfcl.single_turn import DROPPED, HELD_OUT_CATEGORIES, TRAIN_CATEGORIES, BfclEnv, BfclOptions, entry_task, v4_split
from toolpolicy.gate import Gate
from toolpolicy.model import char_codec, make_template
from toolpolicy.rewards import Rubric
from toolpolicy.rollout import EpisodeLimits, RolloutEngine, ScriptedBackend, allow_all_policy
from toolpolicy.types import Episode, Event, Message, ToolCall

pytest.importorskip("bfcl_eval", reason="bfcl-eval is installed by `make test` (pip install --no-deps bfcl-eval)")

TEMPLATE = make_template(compact=True)
WIDE = EpisodeLimits(max_turns=4, max_tokens=10**7, max_turn_tokens=10**6, max_call_chars=10**6)  # live schemas are long
COMPONENTS = ("bfcl_correct", "bfcl_tool_name", "bfcl_param_names", "bfcl_param_values", "bfcl_format")
UNWRITABLE = {"live_simple_106-63-0", "live_simple_112-68-0", "live_multiple_507-149-4", "live_multiple_862-181-3", "live_multiple_964-207-0"}
"""Train entries whose possible answer BFCL's own checker rejects (eval.bfcl_agreement.INTENDED_ANSWER_REJECTED)."""
RIGHT_BUT_MALFORMED = {
    "live_multiple_552-153-1", "live_multiple_595-158-1", "live_multiple_596-158-2", "live_multiple_731-167-2",
    "live_multiple_733-167-4", "live_multiple_735-167-6", "live_multiple_1038-265-0",
}
"""Train entries whose possible answer BFCL accepts but whose schema's types it breaks (see single_turn's docstring)."""


@pytest.fixture(scope="module")
def env() -> BfclEnv:
    return BfclEnv()


@pytest.fixture(scope="module")
def gate(env: BfclEnv) -> Gate:
    """One gate for every engine here: checking the schemas of every function takes seconds."""
    return Gate(allow_all_policy(), env.tools)


def run(env: BfclEnv, gate: Gate, task_ids: list[str], answers: list[Message]) -> list[Episode]:
    """One scripted assistant message per entry through the real engine; a second turn would be an IndexError."""
    encode, decode = char_codec()
    backend = ScriptedBackend({i: [answer] for i, answer in enumerate(answers)}, TEMPLATE.render_assistant, encode)
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, WIDE, gate) as engine:
        return [t.episode for t in engine.run([env.task(i) for i in task_ids])]


def components(episode: Episode) -> tuple[float, ...]:
    return tuple(round(Rubric.from_weights(dict.fromkeys(COMPONENTS, 1.0)).score(episode).components[c], 4) for c in COMPONENTS)


# ---- the rewards, on hand-built entries ------------------------------------------------------

FORECAST = [{
    "name": "weather.get", "description": "The forecast for a city.",
    "parameters": {"type": "dict", "required": ["city", "days"], "properties": {
        "city": {"type": "string", "description": "City name."},
        "days": {"type": "integer", "description": "Days ahead."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit."},
    }},
}]
WEATHER = Entry(
    "hand_weather_0", "live_simple", [Message("user", "Weather in Paris for the next 3 days?")], FORECAST,
    [{"weather.get": {"city": ["Paris", "Paris, France"], "days": [3], "unit": ["celsius", ""]}}],
    shown=shown_functions(FORECAST, "python"),
)
OFF_TOPIC = Entry("hand_irrelevance_0", "live_irrelevance", [Message("user", "Tell me a joke.")], FORECAST, [],
                  shown=shown_functions(FORECAST, "python"))
ANY_CALL = Entry("hand_relevance_0", "live_relevance", [Message("user", "Is it cold out?")], FORECAST, [], kind="relevance",
                 shown=shown_functions(FORECAST, "python"))


def answered(entry: Entry, calls: list[ToolCall], malformed: int = 0, truncated: bool = False) -> Episode:
    events = [Event("invalid_call", 0, "bad_json")] * malformed
    turn = Message("assistant", "" if calls else "No.", tuple(calls))
    return Episode(entry_task(entry), [*entry.messages, turn], events, truncated)


def forecast(**arguments: object) -> ToolCall:
    return ToolCall("weather_get", arguments)  # the shown name: "." is written "_"


@pytest.mark.parametrize(
    "calls, malformed, truncated, expected",
    [
        # correct, tool_name, param_names, param_values, format
        ([forecast(city="paris, FRANCE", days=3)], 0, False, (1, 1, 1, 1, 1)),  # strings compared as BFCL does
        ([forecast(city="Paris", days=3, unit="celsius")], 0, False, (1, 1, 1, 1, 1)),
        ([forecast(city="Paris", days=4)], 0, False, (0, 1, 1, 0.5, 1)),  # 1 of 2 needed values
        ([forecast(city="Paris")], 0, False, (0, 1, 0.5, 0.5, 1)),  # names {city} of {city, days}
        ([forecast(city="Paris", days=3, country="FR")], 1, False, (0, 1, 0.6667, 0.6667, 0)),  # 2 of 3 names; the gate's event
        ([ToolCall("weather_history", {"city": "Paris", "days": 3})], 0, False, (0, 0, 0, 0, 1)),
        ([], 0, False, (0, 0, 0, 0, 1)),
        ([forecast(city="Paris", days=3)] * 2, 0, False, (0, 0.5, 1, 1, 1)),  # names: 1 shared of 1 + 2 - 1
        ([forecast(city="Paris", days=3)], 1, False, (1, 1, 1, 1, 0)),  # an undecodable second call: malformed, not a call
        ([forecast(city="Paris", days=3)], 0, True, (0, 0, 0, 0, 0)),  # cut by a budget: nothing was parsed
    ],
)
def test_each_component_on_a_hand_built_entry(calls, malformed, truncated, expected):
    assert components(answered(WEATHER, calls, malformed, truncated)) == pytest.approx(expected)


def test_irrelevance_passes_with_no_call_and_relevance_with_any():
    assert components(answered(OFF_TOPIC, [])) == (1, 1, 1, 1, 1)
    assert components(answered(OFF_TOPIC, [forecast(city="Paris", days=3)])) == (0, 0, 0, 0, 1)
    assert components(answered(ANY_CALL, [forecast(city="Oslo", days=1)])) == (1, 1, 1, 1, 1)
    assert components(answered(ANY_CALL, [])) == (0, 0, 0, 0, 1)


def test_the_default_rubric_ranks_every_right_answer_above_every_wrong_one(env):
    rubric = Rubric.from_weights(env.default_rewards)
    right = rubric.score(answered(WEATHER, [forecast(city="Paris", days=3)])).total
    wrong = [forecast(city="Paris", days=4)], [forecast(city="Paris")], [forecast(city="Paris", days=3)] * 2, []
    assert right == pytest.approx(1.5)
    assert max(rubric.score(answered(WEATHER, calls)).total for calls in wrong) <= 0.5
    assert env.success_reward == "bfcl_correct"


def test_another_environments_episode_scores_zero():
    from toolpolicy.types import Task

    calc = Episode(Task("calc-1", "2+2?", "4"), [Message("user", "2+2?"), Message("assistant", "", (ToolCall("calculator", {}),))])
    assert components(calc) == (0, 0, 0, 0, 0)


# ---- the split --------------------------------------------------------------------------------


def user_text(entry: Entry) -> str:
    words = re.findall(r"[^\W_]+", " ".join(m.content for m in entry.messages if m.role == "user").lower())
    return " ".join(words)


def names(entry: Entry) -> set[str]:
    return {f["name"].replace(".", "_").lower() for f in entry.functions}


def test_dropped_entries_share_a_question_or_function_with_held_out_ones_and_kept_ones_share_none():
    """Checked against the files read afresh, with the overlap computed here, not by leak_split."""
    entries = load_v4()
    held_out = [e for e in entries if e.category in HELD_OUT_CATEGORIES]
    live = [e for e in entries if e.category in TRAIN_CATEGORIES]
    questions, functions = {user_text(e) for e in held_out} - {""}, set().union(*(names(e) for e in held_out))
    split = v4_split()
    assert sorted(e.id for e in split.held_out) == sorted(e.id for e in held_out)
    assert sorted([e.id for e in split.train] + list(split.dropped)) == sorted(e.id for e in live)
    for entry in live:
        shared = {"question"} if user_text(entry) in questions else set()
        shared |= {f"function {name}" for name in names(entry) & functions}
        if entry.id in split.dropped:
            assert shared and set(split.dropped[entry.id]) == shared, entry.id
        else:
            assert not shared, entry.id


def test_the_dropped_counts_are_the_docstring_table():
    import toolpolicy.envs.bfcl.single_turn as module

    counts = v4_split().counts()
    assert {c: n["dropped"] for c, n in counts.items() if n["dropped"]} == DROPPED
    rows = {line.split()[0]: [int(x) for x in line.split()[1:]] for line in module.__doc__.splitlines()
            if line.strip().startswith("live_") and line.split()[1].isdigit()}
    for category, n in counts.items():
        assert rows[category] == [n["entries"], n["dropped"], n["train"], n["question"], n["function"]], category
    assert len(v4_split().train) == 1999 and len(v4_split().held_out) == 1390


def test_archived_entries_are_split_like_live_ones_and_counted_as_the_docstring_tables():
    """Against the files read afresh (`load_archived`), the overlap computed here."""
    import toolpolicy.envs.bfcl.single_turn as module
    from toolpolicy.envs.bfcl.single_data import ARCHIVED_CATEGORIES, load_archived
    from toolpolicy.envs.bfcl.single_turn import ARCHIVED_DROPPED

    held_out = [e for e in load_v4() if e.category in HELD_OUT_CATEGORIES]
    questions, functions = {user_text(e) for e in held_out} - {""}, set().union(*(names(e) for e in held_out))
    archived = load_archived()
    split = v4_split(archived=True)
    assert [e for e in split.train if e.category in TRAIN_CATEGORIES] == list(v4_split().train)  # live: as without
    assert {e.category for e in archived} == set(ARCHIVED_CATEGORIES)
    kept = {e.id for e in split.train}
    for entry in archived:
        shared = {f"function {name}" for name in names(entry) & functions} | ({"question"} if user_text(entry) in questions else set())
        assert (entry.id not in kept and set(split.dropped[entry.id]) == shared) if shared else entry.id in kept, entry.id
    counts = split.counts()
    assert {c: counts[c]["dropped"] for c in ARCHIVED_CATEGORIES if counts[c]["dropped"]} == ARCHIVED_DROPPED
    rows = {line.split()[0]: [int(x) for x in line.split()[1:]] for line in module.__doc__.splitlines()
            if line.strip().startswith("exec_") and line.split()[1].isdigit()}
    assert set(rows) == set(ARCHIVED_CATEGORIES)
    for category in ARCHIVED_CATEGORIES:
        n = counts[category]
        assert rows[category] == [n["entries"], n["dropped"], n["train"], n["question"], n["function"]], category
    assert sum(counts[c]["train"] for c in ARCHIVED_CATEGORIES) == 132


def test_archived_answers_are_read_as_possible_answers_that_bfcls_checker_takes():
    """Each archived entry's demonstration passes ours and BFCL's own ast_checker and fits its
    schema, but for three left out, read here anyway: one no call passes, two whose answer no
    call fitting the schema can give; an answer that is an expression is refused, the file named."""
    import doctest

    import jsonschema

    import toolpolicy.envs.bfcl.single_data as single_data
    from toolpolicy.envs.bfcl.single_data import ARCHIVED_LEFT_OUT, BfclFileError, executable_answer, load_archived
    from toolpolicy.envs.bfcl.single_turn import checked_schema
    from toolpolicy.eval.bfcl_agreement import official_checker
    from toolpolicy.rewards.bfcl import verdict
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer

    assert doctest.testmod(single_data).failed == 0
    official = official_checker()
    readable = {"exec_multiple_45", "exec_parallel_31", "exec_parallel_multiple_31"}
    read = load_archived(left_out={i: why for i, why in ARCHIVED_LEFT_OUT.items() if i not in readable})
    verdicts = {}
    for entry in read:
        answer = bfcl_answer(entry)
        schemas = {spec.name: checked_schema(spec) for spec in entry.specs()}
        fits = all(jsonschema.Draft202012Validator(schemas[c.name]).is_valid(dict(c.arguments)) for c in answer.tool_calls)
        calls = entry.called(list(answer.tool_calls))
        verdicts[entry.id] = (verdict(calls, **entry.scoring()).ok, official(entry, calls), fits)
    assert {i: v for i, v in verdicts.items() if v != (True, True, True)} == {
        "exec_multiple_45": (False, False, False),
        "exec_parallel_31": (True, True, False),
        "exec_parallel_multiple_31": (True, True, False),
    }
    assert len(load_archived()) == len(read) - len(readable) == 234
    exec_simple = {e.id: e for e in read}["exec_simple_0"]
    assert exec_simple.expected == [{"calc_binomial_probability": {"n": [20], "k": [5], "p": [0.6]}}]
    with pytest.raises(BfclFileError, match=r"x.json: exec_multiple_0: answer 'f\(p=1/6\)' cannot be read"):
        executable_answer(["f(p=1/6)"], [{"name": "f", "parameters": {"properties": {"p": {}}}}], "x.json: exec_multiple_0")


def test_archived_entries_train_through_the_gate_and_engine_and_compose():
    env = BfclEnv(BfclOptions(("live_parallel", "simple_python"), archived=True, composed=20, composed_calls=(2,), enumerated=20, enumerated_calls=(2,)))
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer

    archived = [e for e in env.pools["train"] if e.category.startswith("exec_")]
    assert len(archived) == 132 and not {e.id for e in archived} & set(BfclEnv().entries)
    ids = [e.id for e in archived]
    episodes = run(env, Gate(allow_all_policy(), env.tools), ids, [bfcl_answer(env.entries[i]) for i in ids])
    rubric = Rubric.from_weights(env.default_rewards)
    assert all(rubric.score(e).components["bfcl_correct"] == 1.0 and not e.count("invalid_call") for e in episodes)
    made = [e for e in env.pools["train"] if e.category.startswith(("composed", "enumerated"))]
    assert len(made) == 40 and sum("exec_" in e.id for e in made) >= 30  # 5 live_parallel entries beside 132 archived
    assert {t.info["category"] for t in env.tasks("eval", 200, seed=0)} <= set(HELD_OUT_CATEGORIES)
    cfg = load_config(None, ["env=bfcl", "env.archived=true"])
    assert build_env(cfg.env).archived is True


def test_a_run_of_user_messages_is_one_turn_so_templates_that_alternate_roles_take_it():
    """Three live_irrelevance entries ask in several user messages in a row, which Gemma 3's
    template refuses: each run is one message of the run's contents, a paragraph each."""
    rows = [json.loads(line) for line in (data_folder() / "BFCL_v4_live_irrelevance.json").read_text().splitlines()]
    runs = {row["id"]: row["question"][0] for row in rows if any(a["role"] == b["role"] for a, b in zip(row["question"][0], row["question"][0][1:]))}
    assert sorted(runs) == ["live_irrelevance_292-72-1", "live_irrelevance_298-73-5", "live_irrelevance_527-162-2"]
    for entry in (e for e in load_v4(("live_irrelevance",)) if e.id in runs):
        expected = [(role, "\n\n".join(m["content"] for m in group)) for role, group in itertools.groupby(runs[entry.id], key=lambda m: m["role"])]
        assert [(m.role, m.content) for m in entry.messages] == expected


def test_tasks_come_from_their_split_the_same_for_a_seed(env):
    train = env.tasks("train", 3000, seed=1)  # past the split's 1999: a second shuffle
    assert {t.info["category"] for t in train} == set(TRAIN_CATEGORIES)
    assert not {t.id for t in train} & set(env.dropped) and len({t.id for t in train}) == 1999
    held_out = env.tasks("eval", 50, seed=1)
    assert {t.info["category"] for t in held_out} <= set(HELD_OUT_CATEGORIES)
    assert [t.id for t in env.tasks("test", 50, seed=1)] == [t.id for t in held_out]
    assert [t.id for t in env.tasks("train", 5, seed=1)] == [t.id for t in train[:5]]
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        env.tasks("dev", 1, seed=0)


def test_categories_are_an_option_checked_on_load():
    cfg = load_config(None, ["env=bfcl", "env.categories=[live_simple, simple_python]"])
    env = build_env(cfg.env)
    assert {e.category for e in env.pools["train"]} == {"live_simple"}
    assert {e.category for e in env.pools["eval"]} == {"simple_python"}
    assert set(env.dropped) == {i for i in v4_split().dropped if i.startswith("live_simple_")}
    grouped = build_env(load_config(None, ["env=bfcl", "env.categories=[live, simple_python, live_simple]"]).env)
    assert grouped.categories == (*CATEGORY_GROUPS["live"], "simple_python")  # a group stands for its members, each once
    with pytest.raises(ConfigError, match=r"field 'env.categories': Input should be 'simple_python', .* \(got \['multi_turn_base'\]\)"):
        load_config(None, ["env=bfcl", "env.categories=[multi_turn_base]"])
    with pytest.raises(ValueError, match="no eval entries"):
        make_env("bfcl", categories=("live_simple",)).tasks("eval", 1, seed=0)


def test_composed_entries_join_two_kept_entries_and_score_both_calls_in_any_order(env, gate):
    from toolpolicy.envs.bfcl.single_turn import COMPOSED_CATEGORIES, composed_entries
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer

    composed = make_env("bfcl", composed=40)
    extra = composed.pools["train"][len(env.pools["train"]):]
    assert composed.pools["train"][: len(env.pools["train"])] == env.pools["train"] and len(extra) == 40
    assert composed.pools["eval"] == env.pools["eval"]  # the held-out side is untouched
    assert {e.category for e in extra} == set(COMPOSED_CATEGORIES)
    assert sum(e.category == "composed_parallel" for e in extra) == 20  # half and half
    kept = {e.id: e for e in env.pools["train"]}
    for entry in extra:
        first, second = (kept[i] for i in entry.id.removeprefix("composed_").split("+"))
        assert entry.functions == first.functions == second.functions
        assert entry.expected == first.expected + second.expected
        assert entry.messages == [Message("user", f"{first.messages[0].content}\n{second.messages[0].content}")]
        same = next(iter(first.expected[0])) == next(iter(second.expected[0]))
        assert entry.category == ("composed_parallel" if same else "composed_parallel_multiple")
    assert [e.id for e in composed_entries(env.pools["train"], 40)] == [e.id for e in extra]  # seeded
    with pytest.raises(ValueError, match="composable tuples"):
        composed_entries(env.pools["train"][:3], 2)
    # both calls, in either order, pass; one of them alone fails
    writable = [e for e in extra if not {*e.id.removeprefix("composed_").split("+")} & UNWRITABLE]
    answers = [bfcl_answer(e) for e in writable]
    swapped = [Message("assistant", "", a.tool_calls[::-1]) for a in answers]
    halves = [Message("assistant", "", a.tool_calls[:1]) for a in answers]
    ids = [e.id for e in writable]
    rubric = Rubric.from_weights({"bfcl_correct": 1.0})
    for answer_set, right in ((answers, 1.0), (swapped, 1.0), (halves, 0.0)):
        episodes = run(composed, gate, ids, answer_set)
        assert {rubric.score(e).total for e in episodes} == {right}
    cfg = load_config(None, ["env=bfcl", "env.composed=40"])
    assert [e.id for e in build_env(cfg.env).pools["train"]] == [e.id for e in composed.pools["train"]]


def test_composed_entries_of_three_and_four_calls_ask_distinct_questions_of_one_function_list(env):
    from toolpolicy.envs.bfcl.single_turn import composed_entries, question_key

    kept = {e.id: e for e in env.pools["train"]}
    extra = composed_entries(env.pools["train"], 31, calls=(2, 3, 4))
    assert [len(e.expected) for e in extra] == [2] * 11 + [3] * 10 + [4] * 10  # shared out evenly, in order
    assert [e.id for e in extra[:11]] == [e.id for e in composed_entries(env.pools["train"], 11)]  # two calls as before
    for size in (3, 4):
        of_size = [e for e in extra if len(e.expected) == size]
        assert sum(e.category == "composed_parallel" for e in of_size) == 5  # half call one function
    for entry in extra:
        parts = [kept[i] for i in entry.id.removeprefix("composed_").split("+")]
        assert all(p.functions == entry.functions for p in parts)
        assert entry.expected == [call for p in parts for call in p.expected]
        assert entry.messages == [Message("user", "\n".join(p.messages[0].content for p in parts))]
        assert len({question_key(p) for p in parts}) == len(parts)
        one = len({next(iter(p.expected[0])) for p in parts}) == 1
        assert entry.category == ("composed_parallel" if one else "composed_parallel_multiple")
    again = make_env("bfcl", composed=31, composed_calls=[2, 3, 4]).pools["train"][len(env.pools["train"]):]
    assert [e.id for e in again] == [e.id for e in extra]  # the environment's option, seeded
    with pytest.raises(ValueError, match="not a number of calls"):
        composed_entries(env.pools["train"], 4, calls=(1,))


def test_enumerated_entries_ask_one_said_value_as_a_list_and_expect_one_call_per_value(env, gate):
    from toolpolicy.envs.bfcl.single_turn import ENUMERATED_CATEGORIES, enumerated_entries, mentions
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer

    enumerated = make_env("bfcl", enumerated=60, enumerated_calls=[2, 3, 4])
    extra = enumerated.pools["train"][len(env.pools["train"]):]
    assert enumerated.pools["train"][: len(env.pools["train"])] == env.pools["train"] and len(extra) == 60
    assert enumerated.pools["eval"] == env.pools["eval"]  # the held-out side is untouched
    assert {e.category for e in extra} == set(ENUMERATED_CATEGORIES)
    kept = {e.id: e for e in env.pools["train"]}
    for size, of_size in zip((2, 3, 4), (extra[:20], extra[20:40], extra[40:])):
        for entry in of_size:
            ids, parameter = entry.id.removeprefix("enumerated_").split(":")
            sources = [kept[i] for i in ids.split("+")]
            also = entry.category == "enumerated_parallel_multiple"
            listed, partner = (sources[:-1], sources[-1]) if also else (sources, None)
            assert len(listed) == size and len(entry.expected) == size + also
            assert entry.functions == listed[0].functions
            (function, first), = listed[0].expected[0].items()
            for call, source in zip(entry.expected, listed):  # the first call's arguments, one value from each source
                (name, arguments), = call.items()
                source_value = next(iter(source.expected[0].values()))[parameter]
                assert name == function and {k: v for k, v in arguments.items() if k != parameter} == {
                    k: v for k, v in first.items() if k != parameter
                }
                assert sorted(map(str, arguments[parameter])) == sorted(map(str, source_value))
                assert mentions(entry.messages[0].content, str(arguments[parameter][0])) == 1  # the question says it
            if partner is not None:
                assert entry.expected[-1] == partner.expected[0] and next(iter(partner.expected[0])) != function
                assert partner.messages[0].content.rstrip(".?! ")[1:] in entry.messages[0].content
    assert [e.id for e in enumerated_entries(env.pools["train"], 60)] == [e.id for e in extra]  # seeded
    with pytest.raises(ConfigError, match="field 'env.enumerated': 2 entries of 2 calls asked, but the train split gives 0"):
        enumerated_entries(env.pools["train"][:3], 3, calls=(2, 3))
    # the demonstrator's answer is right by BFCL's verdict; without its last call it is wrong
    writable = [e for e in extra if not {*e.id.removeprefix("enumerated_").split(":")[0].split("+")} & UNWRITABLE]
    answers = [bfcl_answer(e) for e in writable]
    short = [Message("assistant", "", a.tool_calls[:-1]) for a in answers]
    rubric = Rubric.from_weights({"bfcl_correct": 1.0})
    for answer_set, right in ((answers, 1.0), (short, 0.0)):
        episodes = run(enumerated, gate, [e.id for e in writable], answer_set)
        assert {rubric.score(e).total for e in episodes} == {right}
    cfg = load_config(None, ["env=bfcl", "env.enumerated=60"])
    assert [e.id for e in build_env(cfg.env).pools["train"]] == [e.id for e in enumerated.pools["train"]]


def test_an_enumerated_value_keeps_its_quotes_and_a_number_is_not_found_inside_another():
    from toolpolicy.envs.bfcl.single_turn import enumerate_value, mentions, said_values

    def entry(entry_id: str, question: str, nickname: str) -> Entry:
        return Entry(entry_id, "live_simple", [Message("user", question)], [{"name": "connect", "parameters": {}}],
                     [{"connect": {"nickname": [nickname], "timeout": [60]}}])

    first = entry("a", "Connect to the server 'SQL01' within 60 seconds.", "SQL01")
    assert said_values(first) == [("nickname", "SQL01"), ("timeout", "60")]
    made = enumerate_value(first, "nickname", "SQL01", [(entry("b", "Connect to pg1", "pg1"), "pg1"), (entry("c", "c", "db2"), "db2")])
    assert made.messages[0].content == "Connect to the server 'SQL01', 'pg1' and 'db2' within 60 seconds."
    assert [call["connect"]["nickname"] for call in made.expected] == [["SQL01"], ["pg1"], ["db2"]]
    assert made.id == "enumerated_a+b+c:nickname" and made.category == "enumerated_parallel"
    assert mentions("in 2023 and 2", "2") == 1 and mentions("Paris, paris", "PARIS") == 2
    assert said_values(entry("d", "Is Paris or paris nicer?", "Paris")) == []  # said twice: which one to list?


def test_prose_composed_entries_ask_the_same_questions_as_one_paragraph(env):
    from toolpolicy.envs.bfcl.single_turn import OPENINGS, composed_entries, prose, question_key

    lines = composed_entries(env.pools["train"], 31, calls=(2, 3, 4))
    paragraphs = composed_entries(env.pools["train"], 31, calls=(2, 3, 4), style="prose")
    assert [(e.id, e.expected, e.functions) for e in paragraphs] == [(e.id, e.expected, e.functions) for e in lines]
    for asked in paragraphs:
        assert "\n" not in asked.messages[0].content and len(asked.messages) == 1
        rest = question_key(asked)
        for part in asked.id.removeprefix("composed_").split("+"):  # every question, in the order of the calls
            question = question_key(env.entries[part])
            assert question in rest
            rest = rest[rest.index(question) + len(question):]
    assert {p.messages[0].content for p in paragraphs} != {p.messages[0].content for p in lines}
    assert [p.messages for p in composed_entries(env.pools["train"], 31, calls=(2, 3, 4), style="prose")] == [
        p.messages for p in paragraphs
    ]  # seeded by the entry ids
    # each way of asking, by hand: a stop added where a question has none, the first letter lowered after an opening
    asked = {prose(["What is 2+2", "Is it raining in Paris?", "I want tea"], _Fixed(i)) for i in range(len(OPENINGS))}
    assert asked == {
        "What is 2+2. Is it raining in Paris? I want tea.",
        "What is 2+2. Also, is it raining in Paris? Also, I want tea.",
        "First, what is 2+2. Second, is it raining in Paris? Third, I want tea.",
        "First, what is 2+2. Then, is it raining in Paris? Finally, I want tea.",
        "I need help with three things. First, what is 2+2. Next, is it raining in Paris? Lastly, I want tea.",
    }
    twelve = prose([f"q{i}?" for i in range(12)], _Fixed(2))  # past the named ordinals, "Next,"
    assert twelve.startswith("First, q0? Second, q1?") and twelve.endswith("Tenth, q9? Next, q10? Next, q11?")
    assert prose(["A\n  b", "c"], _Fixed(4)) == "I need help with two things. First, a b. Lastly, c."
    with pytest.raises(ConfigError, match="env.composed_style"):
        composed_entries(env.pools["train"], 4, style="sentences")
    cfg = load_config(None, ["env=bfcl", "env.composed=31", "env.composed_calls=[2,3,4]", "env.composed_style=prose"])
    built = build_env(cfg.env).pools["train"][len(env.pools["train"]):]
    assert [e.messages for e in built] == [e.messages for e in paragraphs]


class _Fixed(random.Random):
    """A random source whose `choice` takes the item at a fixed index."""

    def __init__(self, index: int) -> None:
        super().__init__(0)
        self.index = index

    def choice(self, seq):  # type: ignore[override]
        return seq[self.index]


def test_unanswerable_entries_offer_a_kept_question_unrelated_functions_and_pass_only_without_a_call(env, gate):
    from toolpolicy.envs.bfcl.single_turn import UNANSWERABLE_CATEGORY, composable, name_words, unanswerable_entries, unrelated

    made = make_env("bfcl", composed=10, unanswerable=60)
    extra = made.pools["train"][len(env.pools["train"]) + 10:]
    assert len(extra) == 60 and made.pools["eval"] == env.pools["eval"]
    kept = {e.id: e for e in env.pools["train"]}
    questions = set()
    for entry in extra:
        asked, offered = (kept[i] for i in entry.id.removeprefix("unanswerable_").split("+"))
        assert composable(asked) and composable(offered) and entry.category == UNANSWERABLE_CATEGORY
        assert entry.messages == asked.messages and entry.functions == offered.functions and entry.expected == []
        assert entry.shown == offered.shown and not name_words(asked) & name_words(offered)
        questions.add(asked.id)
    assert len(questions) == 60  # each question once
    assert [e.id for e in unanswerable_entries(env.pools["train"], 60)] == [e.id for e in extra]  # seeded
    # what `unrelated` refuses: shared domain words, the domain named in the question, an open-ended function
    other_weather = Entry("hand_weather_1", "live_simple", [Message("user", "Is it windy?")],
                          [{**FORECAST[0], "name": "WeatherService.forecast"}], [])
    shell = Entry("hand_shell_0", "live_simple", [Message("user", "List files")], [{**FORECAST[0], "name": "cmd_controller.execute"}], [])
    films = Entry("hand_films_0", "live_simple", [Message("user", "Find a film")], [{**FORECAST[0], "name": "Movies_3_FindMovies"}], [])
    paris = Entry("hand_paris_0", "live_simple", [Message("user", "Any movies in Paris?")], FORECAST, [])
    assert not unrelated(WEATHER, other_weather) and not unrelated(WEATHER, shell) and not unrelated(paris, films)
    assert unrelated(WEATHER, films)
    # scored as irrelevance: no call passes, a call of an offered function fails
    ids = [e.id for e in extra[:8]]
    first_function = [made.task_specs(made.task(i))[0].name for i in ids]
    calls = [Message("assistant", "", [ToolCall(name, {})]) for name in first_function]
    rubric = Rubric.from_weights({"bfcl_correct": 1.0})
    assert {rubric.score(e).total for e in run(made, gate, ids, [Message("assistant", "I can't do that with these tools.")] * 8)} == {1.0}
    assert {rubric.score(e).total for e in run(made, gate, ids, calls)} == {0.0}
    with pytest.raises(ValueError, match="env.unanswerable"):
        unanswerable_entries(env.pools["train"][:40], 200)
    cfg = load_config(None, ["env=bfcl", "env.unanswerable=60"])
    assert [e.id for e in build_env(cfg.env).pools["train"]][-60:] == [e.id for e in unanswerable_entries(env.pools["train"], 60)]


def test_fewer_functions_drops_only_functions_no_expected_call_names(env, gate):
    from toolpolicy.envs.bfcl.single_turn import fewer_functions
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer

    five = [{**FORECAST[0], "name": f"f{i}"} for i in range(5)]
    shown = shown_functions(five, "python")
    one = Entry("hand_five_0", "live_multiple", WEATHER.messages, five, [{"f3": {"city": ["Paris"], "days": [3]}}], shown=shown)
    two = fewer_functions(one, 2)
    names = [f["name"] for f in two.functions]
    assert len(names) == 2 and "f3" in names and names == sorted(names)  # the called one, one other, in the entry's order
    assert two.shown == [shown[int(n[1])] for n in names] and two.expected == one.expected and two.messages == one.messages
    assert fewer_functions(one, 2) == two  # seeded by the id
    drawn = {tuple(f["name"] for f in fewer_functions(replace(one, id=f"hand_five_{i}"), 2).functions) for i in range(20)}
    assert drawn == {tuple(sorted(("f3", f"f{j}"))) for j in (0, 1, 2, 4)}  # every other one can be drawn
    three_called = Entry("hand_five_1", "live_parallel_multiple", one.messages, five,
                         [{"f1": {}}, {"f4": {}}, {"f3": {}}], shown=shown)
    assert [f["name"] for f in fewer_functions(three_called, 2).functions] == ["f1", "f3", "f4"]  # every called one stays
    assert fewer_functions(WEATHER, 1) is WEATHER
    with pytest.raises(ConfigError, match="env.max_functions"):
        fewer_functions(one, 0)
    # through the config: every train entry, composed and unanswerable ones too, at most 2 functions unless it calls more
    cfg = load_config(None, ["env=bfcl", "env.composed=40", "env.unanswerable=20", "env.max_functions=2"])
    made, full = build_env(cfg.env), make_env("bfcl", composed=40, unanswerable=20)
    assert [e.id for e in made.pools["train"]] == [e.id for e in full.pools["train"]] and made.pools["eval"] == env.pools["eval"]
    fewer = [e for e, f in zip(made.pools["train"], full.pools["train"]) if e != f]
    assert len(fewer) > 400 and all(len(e.functions) <= 2 or {f["name"] for f in e.functions} == {n for c in e.expected for n in c}
                                    for e in made.pools["train"])
    # the answers are the same and still right with the functions left
    called = [e for e in fewer if e.expected and not {*e.id.removeprefix("composed_").split("+")} & UNWRITABLE][:60]
    rubric = Rubric.from_weights({"bfcl_correct": 1.0})
    assert {rubric.score(e).total for e in run(made, gate, [e.id for e in called], [bfcl_answer(e) for e in called])} == {1.0}


# ---- the demonstrator ----------------------------------------------------------------------


@pytest.mark.parametrize("optional", [False, True], ids=["optional-left-out", "optional-given"])
def test_demonstrations_of_the_whole_train_split_pass_the_checker_but_unwritable_answers(env, optional):
    from toolpolicy.eval.bfcl_agreement import INTENDED_ANSWER_REJECTED, official_checker
    from toolpolicy.rewards.bfcl import verdict
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer

    official = official_checker()
    accepted, rejected = 0, set()
    for entry in env.pools["train"]:
        calls = entry.called(list(bfcl_answer(entry, optional).tool_calls))
        ok = verdict(calls, **entry.scoring()).ok
        if entry.kind == "ast" and entry.expected:
            assert official(entry, calls) is ok, entry.id  # BFCL's own ast_checker agrees
        accepted += ok
        rejected |= set() if ok else {entry.id}
    assert (accepted, rejected) == (1994, UNWRITABLE)
    assert UNWRITABLE <= set(INTENDED_ANSWER_REJECTED)


def test_the_demonstrator_gives_an_optional_parameter_its_value_when_asked_and_counts_the_slots_as_its_docstring(env):
    """`demonstrator.optional: given` writes each parameter the possible answer lets be left out
    but gives a value to, with that value; the share of such slots per side is what the
    demonstrator's docstring says."""
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer
    from toolpolicy.envs.bfcl.demonstrator import demonstrate as bfcl_demonstrator

    entry = env.entries["live_simple_0-0-0"]
    assert entry.expected == [{"get_user_info": {"user_id": [7890], "special": ["black"]}}]
    assert bfcl_answer(entry) == bfcl_answer(entry, True)  # no "" here: both give every parameter
    def both(table: dict) -> set[str]:  # the parameters that may be left out and have a value besides null
        return {p for p, v in table.items() if "" in v and any(x not in ("", None) for x in v)}

    def nulled(table: dict) -> set[str]:  # those that may be left out or be null, nothing else
        return {p for p, v in table.items() if "" in v and None in v and all(x in ("", None) for x in v)}

    optional = next(e for e in env.pools["train"] if len(e.expected) == 1 and both(e.expected[0][next(iter(e.expected[0]))]))
    ((function, table),) = optional.expected[0].items()
    left_out, given = bfcl_answer(optional).tool_calls[0].arguments, bfcl_answer(optional, True).tool_calls[0].arguments
    assert not both(table) & set(left_out) and both(table) <= set(given)
    assert {p: given[p] for p in both(table)} == {p: next(x for x in table[p] if x not in ("", None)) for p in both(table)}
    with_null = next(e for e in env.pools["train"] if len(e.expected) == 1 and nulled(e.expected[0][next(iter(e.expected[0]))]))
    assert not nulled(with_null.expected[0][next(iter(with_null.expected[0]))]) & set(bfcl_answer(with_null, True).tool_calls[0].arguments)
    assert bfcl_demonstrator(env.task(optional.id), random.Random(0), env, optional="given")[0].tool_calls[0].arguments == given

    def shares(entries: list[Entry]) -> tuple[int, int]:
        slots = [v for e in entries for c in e.expected for t in c.values() for v in t.values()]
        return round(100 * sum("" not in v for v in slots) / len(slots)), round(100 * sum("" in v and len(v) > 1 for v in slots) / len(slots))

    doc = " ".join(bfcl_demonstrator.__doc__.split())
    held_out, live = shares(list(v4_split().held_out)), shares(list(v4_split().train))
    assert f"held-out answers require a value for {held_out[0]}% of the parameters they name and let {held_out[1]}%" in doc
    assert f"the live ones require one for {live[0]}% and let {live[1]}%" in doc
    assert load_config(None, ["env=bfcl", "demonstrator.optional=given"]).demonstrator.options == {"optional": "given"}
    with pytest.raises(ConfigError, match="demonstrator.optional"):
        load_config(None, ["env=bfcl", "demonstrator.optional=sometimes"])


def test_the_demonstrator_is_found_by_the_environments_name():
    from toolpolicy.checks import demonstrator_for
    from toolpolicy.envs.bfcl.demonstrator import NO_FUNCTION_FITS

    cfg = load_config(None, ["env=bfcl"])
    env = make_env("bfcl")
    irrelevant = next(e for e in env.pools["train"] if e.category == "live_irrelevance")
    assert demonstrator_for(cfg.demonstrator, cfg.env)(env.task(irrelevant.id), random.Random(0), env) == [Message("assistant", NO_FUNCTION_FITS)]


# ---- episodes through the real engine --------------------------------------------------------


def test_every_train_demonstration_through_the_engine_ends_after_its_one_turn(env, gate):
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer

    ids = [e.id for e in env.pools["train"]]
    episodes = run(env, gate, ids, [bfcl_answer(env.entries[i]) for i in ids])
    rubric = Rubric.from_weights(env.default_rewards)
    for episode in episodes:
        entry = env.entries[episode.task.id]
        assert episode.messages[:-1] == entry.messages and episode.messages[-1].role == "assistant"
        assert not episode.truncated and episode.infra_error is None
    scores = {e.task.id: rubric.score(e).components for e in episodes}
    assert {i for i, s in scores.items() if s["bfcl_correct"] != 1.0} == UNWRITABLE
    assert {e.task.id for e in episodes if e.count("invalid_call")} == UNWRITABLE | RIGHT_BUT_MALFORMED
    relevance = [e for e in episodes if e.task.info["category"] == "live_relevance"]
    assert len(relevance) == 16 and all(e.count("tool_call") == 1 for e in relevance)  # a call the gate admits


def test_one_turn_ends_the_episode_calls_or_not_and_malformed_calls_are_counted(env, gate):
    entry = next(e for e in env.pools["train"] if e.category == "live_simple" and e.id not in UNWRITABLE)
    irrelevant = next(e for e in env.pools["train"] if e.category == "live_irrelevance")
    (want,) = entry.expected
    ((function, _),) = want.items()
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer

    right = bfcl_answer(entry)
    bad_json = Message("assistant", '<tool_call>\n{"name": "x", "arguments": {\n</tool_call>')
    extra = Message("assistant", "", (ToolCall(right.tool_calls[0].name, {**right.tool_calls[0].arguments, "zzz": 1}),))
    unknown = Message("assistant", "", (ToolCall("no_such_function", {}),))
    text = Message("assistant", "Nothing to call.")
    cases = [(entry.id, right), (entry.id, bad_json), (entry.id, extra), (entry.id, unknown), (irrelevant.id, text)]
    episodes = run(env, gate, [i for i, _ in cases], [m for _, m in cases])
    for episode in episodes:  # the prompt, one assistant turn, nothing after it (no tool observation)
        assert [m.role for m in episode.messages[-2:]] == ["user", "assistant"] and not episode.truncated
    got = [(components(e), e.count("tool_call"), e.count("invalid_call")) for e in episodes]
    assert got[0] == ((1, 1, 1, 1, 1), 1, 0)
    assert got[1] == ((0, 0, 0, 0, 0), 0, 1)  # nothing decoded: no call, and malformed
    assert got[2][0][0] == 0 and got[2][0][4] == 0 and got[2][1:] == (0, 1)  # the gate refused the unknown parameter
    assert got[3][0][:2] == (0, 0) and got[3][1:] == (0, 1)
    assert got[4] == ((1, 1, 1, 1, 1), 0, 0)
    assert function in {entry.own_names().get(c.name, c.name) for c in right.tool_calls}


def test_the_trajectory_is_the_prompt_and_the_sampled_turn_only(env, gate):
    from toolpolicy.envs.bfcl.demonstrator import bfcl_answer

    entry = next(e for e in env.pools["train"] if e.category == "live_parallel")
    encode, decode = char_codec()
    answer = bfcl_answer(entry)
    backend = ScriptedBackend({0: [answer]}, TEMPLATE.render_assistant, encode)
    with RolloutEngine(env, TEMPLATE, encode, decode, backend, WIDE, gate) as engine:
        (trajectory,) = engine.run([env.task(entry.id)])
    turn = TEMPLATE.render_assistant(answer)
    assert decode(trajectory.token_ids) == TEMPLATE.render_prompt(entry.messages, entry.specs()) + turn
    assert sum(trajectory.loss_mask) == len(encode(turn)) and trajectory.turn_spans == [(trajectory.prompt_len, len(trajectory.token_ids))]
    assert trajectory.episode.count("tool_call") == len(answer.tool_calls) > 1


def test_cli_sft_rl_and_eval_steps_with_a_tiny_model(tmp_path):
    """The real commands on two categories: SFT on demonstrations, an RL step, evaluation on the held-out side."""
    import json
    from pathlib import Path

    from toolpolicy.cli import main

    smoke = Path(__file__).resolve().parents[1] / "src" / "toolpolicy" / "configs" / "bfcl_multi_turn_smoke.yaml"
    settings = ["--set", f"run.dir={tmp_path}", "--set", "env=bfcl", "--set", "env.categories=[live_simple, simple_python]"]
    assert main(["sft", str(smoke), *settings]) == 0
    assert main(["train", str(smoke), *settings, "--set", f"rl.init_from={tmp_path / 'sft' / 'final'}"]) == 0
    assert main(["eval", str(smoke), *settings, "--gate", "on"]) == 0
    summary = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert summary["n"] == 2 and summary["infra_errors"] == 0
    rows = [json.loads(line) for line in (tmp_path / "eval" / "eval_samples.jsonl").read_text().splitlines()]
    assert {row["task"]["info"]["category"] for row in rows} == {"simple_python"}
