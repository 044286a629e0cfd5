"""The hooks an environment or session may give are declared on envs/base.py's Env and
Session and called, never probed for; a class written without the base is adopted."""

import ast
from pathlib import Path

from toolpolicy.envs import ENVS, make_env
from toolpolicy.envs.base import Env, Session, as_env, as_session, open_session
from toolpolicy.tools import ToolSet
from toolpolicy.types import Message, Task

SOURCE = Path(__file__).resolve().parents[1] / "src" / "toolpolicy"
HOOKS = {
    name for base in (Env, Session) for name in vars(base) if not name.startswith("_")
} | {"tools", "name", "system_prompt", "default_rewards", "success_reward"}


def test_hooks_are_called_not_probed_with_getattr_or_hasattr():
    probes = []
    for path in SOURCE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
                named = node.args[1] if len(node.args) > 1 else None
                if isinstance(named, ast.Constant) and named.value in HOOKS:
                    probes.append(f"{path.relative_to(SOURCE)}:{node.lineno}: {node.func.id}(..., {named.value!r})")
    assert probes == []


def test_every_built_in_environment_and_its_sessions_subclass_the_base():
    assert all(issubclass(cls, Env) for cls in ENVS.values())
    env = make_env("calc")
    assert isinstance(open_session(env, env.tasks("eval", 1, 0)[0]), Session)


class Plain:
    """An environment written to the required members only, without the base."""

    name = "plain"
    system_prompt = "Be plain."
    default_rewards = {"correct_answer": 1.0}
    success_reward = "correct_answer"
    tools = ToolSet([])

    def __init__(self) -> None:
        self.calls = 0

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        return [Task(f"{split}-{i}", "Say hi.", "hi") for i in range(n)]


def test_a_plain_environment_is_adopted_with_the_bases_defaults_and_shares_its_state():
    plain = Plain()
    env = as_env(plain)
    task = env.tasks("eval", 1, 0)[0]
    assert isinstance(env, Plain) and isinstance(env, Env) and as_env(env) is env
    assert env.initial_messages(task) == [Message("system", "Be plain."), Message("user", "Say hi.")]
    assert env.on_answer(task, []) is None and env.single_turn is False and env.policy_file == ""
    assert env.task_specs(task) == [] and open_session(env, task).finish() == {}
    env.calls += 1
    assert plain.calls == 1  # one state


def test_a_plain_session_is_adopted_with_the_bases_defaults():
    class Counter:
        def __init__(self) -> None:
            self.tools = ToolSet([])

        def on_answer(self, messages):
            return None

    session = as_session(Counter())
    assert session.single_turn is False and session.finish() == {} and as_session(session) is session


class Guest(Plain, Env):
    """An environment with a simulated user but no scenario to tell a served one."""

    def __init__(self, user=None) -> None:
        self.user = user


def test_a_served_user_needs_an_environment_that_tells_it_the_scenario():
    import pytest

    from toolpolicy.build import load_config
    from toolpolicy.config import ConfigError

    served = ["env.user_url=http://localhost:1", "env.user_model=m"]
    assert load_config(None, ["env=hotel", *served]).env.user_url
    with pytest.raises(ConfigError, match="field 'env.user_url': environment 'test_env_hooks:Guest' tells a served user no scenario"):
        load_config(None, ["env=test_env_hooks:Guest", *served])
