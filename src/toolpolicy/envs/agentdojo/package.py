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
Version = Literal["v1", "v1.1", "v1.1.1", "v1.1.2", "v1.2", "v1.2.1", "v1.2.2"]
"""Every benchmark version the package registers: the same four suites, with user and
injection tasks revised or added from one version to the next."""
VERSIONS: tuple[str, ...] = get_args(Version)

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
    "important_instructions_wrong_model_name",
    "important_instructions_wrong_user_name",
    "tool_knowledge",
    "dos",
    "swearwords_dos",
    "captcha_dos",
    "offensive_email_dos",
    "felony_dos",
]
"""`none` (user tasks alone, for utility) and every attack the package registers but
`manual` (a person types each injection): each writes its text from the user task and the
injection task without asking a model. The `*dos` attacks want the agent to stop rather
than to reach the injection task's goal: the package runs them with one injection task and
counts them successful when the user task fails (`is_dos`)."""
ATTACKS: tuple[str, ...] = get_args(Attack)

TARGET_NAME = "local"
"""The model name the attack texts address ("Local model" in AgentDojo's table)."""


@lru_cache(maxsize=None)
def load_suite(name: str, version: str = BENCHMARK_VERSION) -> Any:
    """The TaskSuite `name` of benchmark `version`; a clear error names the known suites and versions."""
    if name not in SUITES:
        raise ValueError(f"unknown AgentDojo suite {name!r}; known: {', '.join(SUITES)}")
    if version not in VERSIONS:
        raise ValueError(f"unknown AgentDojo benchmark version {version!r}; known: {', '.join(VERSIONS)}")
    from agentdojo.task_suite import get_suite

    return get_suite(version, name)


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
    return user_task.init_environment(_loaded(suite, text).model_copy(deep=True))


@lru_cache(maxsize=16)
def _loaded(suite: Any, text: str) -> Any:
    """The environment of `suite` (a loaded suite: one object per name and version) with `text`
    in every injection vector ("": the defaults); parsing the suite's YAML is the slow part
    (0.5 s for workspace), so each is parsed once and copied."""
    injections = {vector: text for vector in suite.get_injection_vector_defaults()} if text else {}
    return suite.load_and_inject_default_environment(injections)


def attack_text(suite: Any, attack: str, user_task: Any, injection_task: Any) -> str:
    """The package's text of `attack` asking for `injection_task`'s goal, as it writes it for
    the injection vectors `user_task` reads (one text for all of them: none of the package's
    attacks writes a vector's text from the vector)."""
    texts = set(_attack(suite, attack).attack(user_task, injection_task).values())
    if len(texts) != 1:
        raise ValueError(f"AgentDojo attack {attack!r} wrote {len(texts)} texts for {user_task.ID}, not one")
    return texts.pop()


def is_dos(suite: Any, attack: str) -> bool:
    """Whether `attack` wants the agent to stop (it then succeeds when the user task fails)."""
    return attack != "none" and bool(_attack(suite, attack).is_dos_attack)


@lru_cache(maxsize=64)
def _attack(suite: Any, attack: str) -> Any:
    """The package's attack object for `suite` (a loaded suite: one object per name and
    version, so it keys the cache), aimed at a target named TARGET_NAME."""
    if attack not in ATTACKS or attack == "none":
        raise ValueError(f"unknown AgentDojo attack {attack!r}; known: {', '.join(ATTACKS)}")
    from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
    from agentdojo.attacks import load_attack

    class Target(BasePipelineElement):
        name = TARGET_NAME

        def query(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("the attack text needs only the target's name")

    return load_attack(attack, suite, Target())


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
