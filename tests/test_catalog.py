"""The one table of built-in environments (envs/catalog.py) and what is derived from it."""

import tomllib
from pathlib import Path

from toolpolicy.config import FLAT_DEMONSTRATOR_OPTIONS, FLAT_ENV_OPTIONS
from toolpolicy.envs import DEMONSTRATORS, ENVS
from toolpolicy.envs.catalog import BUILT_IN
from toolpolicy.registry import from_import_path

ROOT = Path(__file__).resolve().parents[1]


def test_pyprojects_entry_points_are_the_tables_rows():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    resolved = {group: {name: from_import_path(target) for name, target in declared[group].items()} for group in declared}
    assert resolved["toolpolicy.envs"] == {name: row.env for name, row in BUILT_IN.items()}
    assert resolved["toolpolicy.demonstrators"] == {name: row.demonstrator for name, row in BUILT_IN.items() if row.demonstrator}


def test_the_name_tables_are_read_from_the_catalog():
    assert ENVS == {name: row.env for name, row in BUILT_IN.items()}
    assert DEMONSTRATORS == {name: row.demonstrator for name, row in BUILT_IN.items() if row.demonstrator is not None}
    assert set(FLAT_ENV_OPTIONS) | set(FLAT_DEMONSTRATOR_OPTIONS) <= set(BUILT_IN)


def test_each_rows_policy_file_exists_and_each_flat_option_is_an_option_of_its_row():
    from toolpolicy.checks import declared_options
    from toolpolicy.config import FLAT_DEMONSTRATOR_OPTIONS, FLAT_ENV_OPTIONS

    for name, row in BUILT_IN.items():
        assert row.policy_file is None or row.policy_file.is_file(), name
    for name, options in FLAT_ENV_OPTIONS.items():
        assert set(options) <= set(declared_options(BUILT_IN[name].env)[0]), name
    for name, options in FLAT_DEMONSTRATOR_OPTIONS.items():
        assert set(options) <= set(declared_options(BUILT_IN[name].demonstrator)[0]), name


def test_each_built_in_environment_takes_its_options_in_a_documented_class():
    """One pattern for the built-ins: a frozen dataclass its constructor takes as `options`,
    every field documented; `make_env` takes its fields as keywords."""
    from dataclasses import fields

    from toolpolicy.envs import make_env, options_class

    for name, row in BUILT_IN.items():
        holder = options_class(row.env)
        assert holder is not None and holder.__dataclass_params__.frozen, name
        assert [field.name for field in fields(holder)], name
    env = make_env("calc", hard_fraction=1.0)
    assert env.options.hard_fraction == 1.0 and all(t.info["difficulty"] == "hard" for t in env.tasks("train", 8, seed=0))


def test_every_option_of_a_built_in_environment_and_demonstrator_says_what_it_does():
    from toolpolicy.checks import DEMONSTRATOR_ARGUMENTS, ENV_ARGUMENTS, option_docs

    undocumented = [
        f"{name}: {option}" for name, row in BUILT_IN.items()
        for factory, passed in ((row.env, ENV_ARGUMENTS), (row.demonstrator, DEMONSTRATOR_ARGUMENTS)) if factory is not None
        for option, doc in option_docs(factory, passed).items() if not doc
    ]
    assert undocumented == []
    assert option_docs(BUILT_IN["calc"].demonstrator, DEMONSTRATOR_ARGUMENTS) == {
        "tool_on_hard": "the probability that it calls the calculator on a hard task (else it guesses).",
        "tool_on_easy": "the probability that it makes a needless call on an easy task.",
        "malformed": "the probability that a call is first written malformed, then fixed.",
    }



def test_the_installed_entry_points_are_pyprojects():
    """A stale install (made before an entry point moved) fails here: `pip install -e .` renews it."""
    from importlib.metadata import entry_points

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    for group in ("toolpolicy.envs", "toolpolicy.demonstrators"):
        installed = {point.name: point.value for point in entry_points(group=group) if point.dist and point.dist.name == "toolpolicy"}
        assert installed == declared[group], f"{group}: the installed metadata is older than pyproject.toml; run pip install -e ."
