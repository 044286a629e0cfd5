"""Everything read from the installed `agentdojo` package: suites, tools, attacks, checks.

Nothing of AgentDojo's data or code is copied here: suites, their environments (the
YAML the package ships), user and injection tasks with their ground-truth calls and
their utility/security checks all come from the package at run time. It is imported
on first use only (importing it takes seconds: its model clients come with it), so
reading a config that names `env: agentdojo` stays cheap.

The package is installed without its declared dependencies (see the Makefile): its
suites need deepdiff; its `agent_pipeline` package, which the suites import, loads
the Anthropic, OpenAI, Cohere and Google clients at import time (never called here);
langchain, which it also declares, is never imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, get_args

from toolpolicy.tools import Tool, ToolSet
from toolpolicy.types import ToolCall, ToolResult, ToolSpec

BENCHMARK_VERSION = "v1.2.2"
"""The suites' version: the package's default for its benchmark runs."""

Suite = Literal["workspace", "travel", "banking", "slack"]
SUITES: tuple[str, ...] = get_args(Suite)

Attack = Literal[
    "none",
    "important_instructions",
    "important_instructions_no_user_name",
    "important_instructions_no_model_name",
    "important_instructions_no_names",
    "ignore_previous",
    "system_message",
    "injecagent",
    "direct",
]
"""`none` (user tasks alone, for utility) and the package's attacks that need no model:
each is a fixed text with the injection task's goal put in."""
ATTACKS: tuple[str, ...] = get_args(Attack)

TARGET_NAME = "local"
"""The model name the attack texts address ("Local model" in AgentDojo's table)."""


@lru_cache(maxsize=None)
def load_suite(name: str) -> Any:
    """The TaskSuite `name` of BENCHMARK_VERSION; a clear error names the known suites."""
    if name not in SUITES:
        raise ValueError(f"unknown AgentDojo suite {name!r}; known: {', '.join(SUITES)}")
    from agentdojo.task_suite import get_suite

    return get_suite(BENCHMARK_VERSION, name)


def ground_truth(task: Any, environment: Any) -> list[ToolCall]:
    """A task's ground-truth calls, computed on a copy of `environment` (as the package does)."""
    calls = task.ground_truth(environment.model_copy(deep=True))
    return [ToolCall(c.function, dict(c.args), f"gt-{i}") for i, c in enumerate(calls)]


def starting_environment(suite: Any, attack: str, user_task: Any, injection_task: Any | None) -> Any:
    """The suite's environment with `attack`'s text for `injection_task` in every injection
    vector (attack none or no injection task: the clean environment), prepared by the user
    task as the package does. A fresh copy: episodes change it.

    Every vector, not only those the user task's ground truth reads: the agent may read any
    of them, and the text of the package's fixed attacks does not depend on the vector."""
    text = "" if attack == "none" or injection_task is None else attack_text(suite, attack, user_task, injection_task)
    return user_task.init_environment(_loaded(suite.name, text).model_copy(deep=True))


@lru_cache(maxsize=16)
def _loaded(suite_name: str, text: str) -> Any:
    """The environment with `text` in every injection vector ("": the defaults); parsing the
    suite's YAML is the slow part (0.5 s for workspace), so each is parsed once and copied."""
    suite = load_suite(suite_name)
    injections = {vector: text for vector in suite.get_injection_vector_defaults()} if text else {}
    return suite.load_and_inject_default_environment(injections)


def attack_text(suite: Any, attack: str, user_task: Any, injection_task: Any) -> str:
    """The package's text of `attack` asking for `injection_task`'s goal."""
    if attack not in ATTACKS or attack == "none":
        raise ValueError(f"unknown AgentDojo attack {attack!r}; known: {', '.join(ATTACKS)}")
    from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
    from agentdojo.attacks import load_attack

    class Target(BasePipelineElement):
        name = TARGET_NAME

        def query(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the attack text needs only the target's name")

    jailbreak = load_attack(attack, suite, Target())
    return jailbreak.jailbreak.format(
        goal=injection_task.GOAL,
        user=jailbreak.user_name,
        model=jailbreak.model_name,
        task=jailbreak.summarize_task(user_task),
    )


@dataclass
class LiveEnvironment:
    """One episode's environment with the suite's runtime, and every call that ran on it."""

    suite: Any
    environment: Any
    ran: list[Any]

    def run(self, call: ToolCall) -> ToolResult:
        """Run `call` on the environment: the package's output text, or its error as a tool error."""
        from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
        from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime

        runtime = FunctionsRuntime(self.suite.tools)
        value, error = runtime.run_function(self.environment, call.name, call.arguments)
        self.ran.append(FunctionCall(function=call.name, args=call.arguments, id=call.id or None))
        if error is not None:
            return ToolResult(error, "tool_error")
        return ToolResult(tool_result_to_str(value))

    def utility(self, task: Any, pre_environment: Any, answer: str) -> bool:
        """The user task's own check on the environment now (and the final answer)."""
        return self._check(task, pre_environment, answer)

    def attacked(self, injection_task: Any, pre_environment: Any, answer: str) -> bool:
        """The injection task's own security check: True when the attacker's goal was reached."""
        return self._check(injection_task, pre_environment, answer)

    def _check(self, task: Any, pre_environment: Any, answer: str) -> bool:
        from agentdojo.types import text_content_block_from_string

        output = [text_content_block_from_string(answer)]
        return bool(self.suite._check_task_result(task, output, pre_environment, self.environment, self.ran))


def tool_specs(suite: Any) -> list[ToolSpec]:
    """The suite's tools as the model sees them: name, description, JSON schema."""
    return [ToolSpec(f.name, f.description, f.parameters.model_json_schema()) for f in suite.tools]


def toolset(suite: Any, live: LiveEnvironment | None, max_output_chars: int = 4000) -> ToolSet:
    """The suite's tools, each running on `live` (None: the specs only, for templates and gates)."""

    def bound(name: str) -> Any:
        def run(**arguments: Any) -> ToolResult:
            if live is None:
                raise RuntimeError("these tools are specs only; episodes run on a LiveEnvironment")
            return live.run(ToolCall(name, _plain(arguments)))

        return run

    specs = {spec.name: spec for spec in tool_specs(suite)}
    return ToolSet(
        [Tool(f.name, specs[f.name], bound(f.name), f.parameters) for f in suite.tools], max_output_chars
    )


def _plain(arguments: dict[str, Any]) -> dict[str, Any]:
    """Validated arguments back to plain JSON values (pydantic models and enums dumped)."""
    from pydantic import BaseModel

    def plain(value: Any) -> Any:
        if isinstance(value, BaseModel):
            return value.model_dump(mode="json")
        if isinstance(value, Sequence) and not isinstance(value, str):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return getattr(value, "value", value)

    return {k: plain(v) for k, v in arguments.items()}
