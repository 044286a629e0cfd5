"""Extensions by name: import paths, installed packages' entry points, the built-ins, and the errors."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest

from typing import Literal

from toolpolicy.build import build_env
from toolpolicy.build import load_config
from toolpolicy.trainer.demonstrations import demonstrator_scripts
from toolpolicy.config import ConfigError
from toolpolicy.envs import ENVS, USERS, CalcEnv, HotelEnv
from toolpolicy.registry import DEMONSTRATOR, ENVIRONMENT, REWARD, USER, declared_in, from_import_path
from toolpolicy.rewards import REWARD_FUNCTIONS, Rubric, term_means
from toolpolicy.checks import demonstrator_for
from toolpolicy.envs import DEMONSTRATORS
from toolpolicy.types import Episode, Message, Task

ROOT = Path(__file__).resolve().parents[1]


# ---- objects the tests name by import path ("test_extensions:...") --------------------


def said_please(episode: Episode) -> float:
    """A custom reward function: 1.0 if any assistant message says please."""
    return float(any("please" in m.content.lower() for m in episode.messages if m.role == "assistant"))


def always_answer_seven(task: Task, rng: random.Random, env, *, answer: int = 7) -> list[Message]:
    """A custom demonstrator with an option of its own."""
    return [Message("assistant", f"Answer: {answer}")]


class WideCalc(CalcEnv):
    """A plugin environment with options of its own: no Config field names them."""

    def __init__(self, digits: int = 2, label: Literal["plain", "fancy"] = "plain") -> None:
        super().__init__()
        self.digits, self.label = digits, label


class SilentGuest:
    """A custom user simulator that never replies."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def reply(self, messages: list[Message]) -> str | None:
        return None


NOT_CALLABLE = 3


# ---- the built-ins are declared as entry points, and found without them -----------------


@pytest.mark.parametrize(
    "kind, builtins", [(ENVIRONMENT, ENVS), (REWARD, REWARD_FUNCTIONS), (DEMONSTRATOR, DEMONSTRATORS), (USER, USERS)]
)
def test_pyproject_declares_every_builtin_as_an_entry_point(kind, builtins):
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][kind.group]
    assert set(declared) == set(builtins)
    for name, path in declared.items():
        assert from_import_path(path) is builtins[name], name


def _install(site: Path, distribution: str, group: str, entries: dict[str, str]) -> None:
    """A package as pip leaves it: a dist-info folder with its entry points, on sys.path."""
    info = site / f"{distribution}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder of installed packages for this test only."""
    monkeypatch.syspath_prepend(str(tmp_path))
    declared_in.cache_clear()
    yield tmp_path
    declared_in.cache_clear()


def test_an_installed_packages_entry_point_names_an_environment_and_a_reward(site):
    _install(site, "calcplugin", "toolpolicy.envs", {"calc2": "toolpolicy.envs.calc:CalcEnv"})
    _install(site, "rewardplugin", "toolpolicy.rewards", {"please": "test_extensions:said_please"})
    cfg = load_config(None, ["env=calc2", "rewards.weights={correct_answer: 1.0, please: 0.0}"])
    assert isinstance(build_env(cfg.env), CalcEnv)
    assert [t.fn for t in Rubric.from_weights(cfg.rewards.weights).terms] == [REWARD_FUNCTIONS["correct_answer"], said_please]


def test_the_builtins_resolve_through_their_own_entry_points_after_a_fresh_install(site):
    # a fresh `pip install -e .` declares calc as pyproject.toml does; the stale venv has none
    _install(site, "toolpolicy_fresh", "toolpolicy.envs", {"calc": "toolpolicy.envs.calc:CalcEnv"})
    assert "calc" in declared_in("toolpolicy.envs")
    assert isinstance(build_env(load_config(None, ["env=calc"]).env), CalcEnv)


def test_two_packages_giving_one_name_different_objects_is_an_error(site):
    _install(site, "one", "toolpolicy.envs", {"arith": "toolpolicy.envs.calc:CalcEnv"})
    _install(site, "two", "toolpolicy.envs", {"arith": "toolpolicy.envs.hotel:HotelEnv"})
    with pytest.raises(ConfigError, match=r"field 'env.name': 'arith': installed packages give the environment different objects"):
        load_config(None, ["env=arith"])


# ---- import paths, and the errors that name the field and what was tried ----------------


def test_import_paths_name_an_environment_a_reward_a_demonstrator_and_a_user():
    cfg = load_config(None, [
        "env=toolpolicy.envs.hotel:HotelEnv", "env.user=test_extensions:SilentGuest",
        "demonstrator=test_extensions:always_answer_seven", "rewards.weights={task_success: 1.0, 'test_extensions:said_please': 0.0}",
    ])
    env = build_env(cfg.env)
    assert isinstance(env, HotelEnv) and env.user is SilentGuest
    assert demonstrator_for(cfg.demonstrator, cfg.env) is always_answer_seven
    rubric = Rubric.from_weights(cfg.rewards.weights)
    assert [t.name for t in rubric.terms] == ["task_success", "said_please"]  # reported by its own name
    episode = Episode(Task("t", "", ""), [Message("assistant", "Please hold.")])
    assert term_means([rubric.score(episode)]) == {"task_success": 0.0, "said_please": 1.0}


@pytest.mark.parametrize(
    "override, message",
    [
        ("env=mypkg.envs:Adder", r"field 'env.name': 'mypkg.envs:Adder': module mypkg.envs not found \(tried import path"),
        ("env=test_extensions:Adder", r"field 'env.name': 'test_extensions:Adder': test_extensions has no attribute Adder \(tried import path\)"),
        ("env=test_extensions:NOT_CALLABLE", r"field 'env.name': 'test_extensions:NOT_CALLABLE': is a int, not a callable environment"),
        ("env=adder", r"field 'env.name': 'adder': no environment of that name \(tried entry points of group toolpolicy.envs: .*built-ins: agentdojo, bfcl, bfcl_multi_turn, calc, hotel, zoom\)"),
        ("rewards.weights={'mypkg.rewards:exact': 1}", r"field 'rewards.weights': 'mypkg.rewards:exact': module mypkg.rewards not found"),
        ("rewards.weights={exact: 1}", r"field 'rewards.weights': 'exact': no reward function of that name .*group toolpolicy.rewards"),
        ("demonstrator=mypkg:expert", r"field 'demonstrator.name': 'mypkg:expert': module mypkg not found"),
        ("env.user=nobody", r"field 'env.user': 'nobody': no user simulator of that name .*built-ins: scripted"),
        ("env.user=scripted", r"field 'env.user': environment 'calc' takes no user simulator"),
    ],
)
def test_a_name_that_resolves_to_nothing_is_a_config_error_saying_what_was_tried(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_an_import_that_fails_inside_the_module_is_not_reported_as_a_missing_module(tmp_path, monkeypatch):
    (tmp_path / "broken_env.py").write_text("import numpy_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"importing broken_env failed: ModuleNotFoundError: .*numpy_that_is_not_installed"):
        load_config(None, ["env=broken_env:Env"])


def test_two_reward_functions_with_one_reported_name_are_refused():
    with pytest.raises(ConfigError, match=r"both be reported as \['correct_answer'\]"):
        load_config(None, ["rewards.weights={correct_answer: 1, 'toolpolicy.rewards:correct_answer': 0}"])


def test_an_environment_named_by_import_path_needs_a_demonstrator_or_data_for_sft():
    cfg = load_config(None, ["env=toolpolicy.envs.calc:CalcEnv"])
    with pytest.raises(ConfigError, match=r"field 'demonstrator.name': environment 'toolpolicy.envs.calc:CalcEnv' has no built-in demonstrator"):
        demonstrator_for(cfg.demonstrator, cfg.env)


def test_a_plugin_environment_takes_its_own_options_from_the_env_section(tmp_path: Path):
    """Options are the plugin's keyword parameters, typed by their annotations on load; the
    config has no field for them, and an unknown or mistyped one names env.OPTION."""
    config = tmp_path / "wide.yaml"
    config.write_text("env:\n  name: test_extensions:WideCalc\n  digits: 4\n  label: fancy\n")
    env = build_env(load_config(config).env)
    assert isinstance(env, WideCalc) and (env.digits, env.label) == (4, "fancy")
    assert build_env(load_config(config, ["env.digits=3"]).env).digits == 3
    with pytest.raises(ConfigError) as error:
        load_config(config, ["env.digits=many", "env.label=odd", "env.colour=red"])
    message = str(error.value)
    assert "field 'env.digits': Input should be a valid integer" in message
    assert "field 'env.label': Input should be 'plain' or 'fancy'" in message
    assert "field 'env.colour': WideCalc takes no option 'colour' (its options: digits, label)" in message
    with pytest.raises(ConfigError, match=r"field 'env.suite': CalcEnv takes no option 'suite' \(its options: hard_fraction\)"):
        load_config(None, ["env.suite=banking"])  # an option of another environment


def test_a_demonstrator_takes_its_own_options_from_the_demonstrator_section():
    cfg = load_config(None, ["demonstrator=test_extensions:always_answer_seven", "demonstrator.answer=9"])
    env = build_env(cfg.env)
    scripts = demonstrator_scripts(cfg, env, env.tasks("train", 2, seed=0), "sft")
    assert [s[0].content for s in scripts] == ["Answer: 9", "Answer: 9"]
    with pytest.raises(ConfigError, match=r"field 'demonstrator.tool_on_hard': .*always_answer_seven takes no option 'tool_on_hard' \(its options: answer\)"):
        load_config(None, ["demonstrator=test_extensions:always_answer_seven", "demonstrator.tool_on_hard=1"])
    with pytest.raises(ConfigError, match=r"field 'demonstrator.tool_on_hard': Input should be less than or equal to 1"):
        load_config(None, ["demonstrator.tool_on_hard=2"])  # the calc demonstrator's own option, checked by its annotation
    cfg = load_config(None, ["demonstrator.tool_on_hard=1", "demonstrator.tool_on_easy=0", "demonstrator.malformed=0"])
    env = build_env(cfg.env)
    tasks = env.tasks("train", 40, seed=0)
    scripts = demonstrator_scripts(cfg, env, tasks, "sft")
    calls = [sum(len(m.tool_calls) for m in script) for script in scripts]
    assert all(c >= 1 for c, t in zip(calls, tasks) if t.info["difficulty"] == "hard")
    assert all(c == 0 for c, t in zip(calls, tasks) if t.info["difficulty"] == "easy")


def test_the_tutorial_page_shows_the_example_file_as_it_is():
    page = (ROOT / "docs" / "environments.md").read_text()
    assert (ROOT / "examples" / "adder" / "adder.py").read_text() in page
    assert (ROOT / "examples" / "adder" / "policy.yaml").read_text() in page
