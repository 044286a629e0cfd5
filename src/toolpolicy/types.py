"""Plain data passed between layers: messages, tool calls, tool results, tasks, episodes.

Nothing here imports anything but the standard library, so every layer can use
these types without pulling in torch, tokenizers or a policy engine.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for, already decoded from its text."""

    name: str
    arguments: dict[str, Any]
    id: str = ""


@dataclass(frozen=True)
class Image:
    """A picture a message carries (a tool's result, a task's input): PNG bytes and their size
    in pixels. Bytes keep this module free of imaging libraries; tools/images.py reads and
    writes them, and a vision model's processor (model/vision.py) turns them into pixels."""

    png: bytes
    width: int
    height: int

    def to_dict(self) -> dict[str, Any]:
        return {"png": base64.b64encode(self.png).decode("ascii"), "width": self.width, "height": self.height}

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Image:
        return Image(base64.b64decode(data["png"]), int(data["width"]), int(data["height"]))


@dataclass(frozen=True)
class Reading:
    """A picture with what a reader should see where: `regions` are (label, box) pairs, each
    box (left, top, right, bottom) in the picture's pixels, and `text` what it says. An environment that shows pictures
    offers these for the embedded VLM's reading warm-up (model/reading.py)."""

    image: Image
    regions: tuple[tuple[str, tuple[float, float, float, float]], ...]
    text: str = ""
    """What the picture reads as a whole ("" when nothing, or nothing legible)."""


@dataclass(frozen=True)
class CallError:
    """A tool call that could not be decoded from the model's text.

    `kind` is one of: "unclosed_tag", "bad_json", "not_an_object", "missing_name",
    "bad_arguments", "too_long". `raw` is the offending text, cut to a bounded size.
    `call_id` is the id a chat-completions server gave the call (empty for calls
    parsed out of generated text).
    """

    kind: str
    message: str
    raw: str = ""
    call_id: str = ""


@dataclass(frozen=True)
class Message:
    """One chat message. Assistant messages may carry tool calls; tool messages carry
    the result of one call (`name` is the tool that produced it, `tool_call_id` the
    id of the call it answers when the call had one)."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    name: str = ""
    tool_call_id: str = ""
    reasoning: str = ""
    """An assistant's reasoning block (`<think>`), kept apart from its content."""
    images: tuple[Image, ...] = ()
    """Pictures the message shows (a user's or a tool's), rendered before its text."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.reasoning:
            out["reasoning"] = self.reasoning
        if self.images:
            out["images"] = [image.to_dict() for image in self.images]
        if self.tool_calls:
            out["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in self.tool_calls]
        if self.name:
            out["name"] = self.name
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Message:
        calls = tuple(ToolCall(c["name"], dict(c.get("arguments", {}))) for c in data.get("tool_calls", ()))
        return Message(
            data["role"], data.get("content", ""), calls, data.get("name", ""), data.get("tool_call_id", ""), data.get("reasoning", ""),
            tuple(Image.from_dict(image) for image in data.get("images", ())),
        )


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool: name, description, JSON schema of its arguments.

    `effect` declares whether a call only reads or may change state ("write"). The
    model is not shown it; environments and evaluation use it to count writes."""

    name: str
    description: str
    parameters: dict[str, Any]
    effect: Literal["read", "write"] = "read"

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI / Hermes function-calling shape that chat templates embed."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


ErrorKind = Literal["unknown_tool", "invalid_arguments", "tool_error", "timeout", "denied", "infra", "exception"]


@dataclass(frozen=True)
class ToolResult:
    """What a tool call produced. `error` is None on success; otherwise it says whose
    fault the failure was: the model's ("unknown_tool", "invalid_arguments",
    "tool_error", "denied") or the machine's ("timeout", "infra", and "exception":
    the tool raised something other than ToolError, `content` naming the tool and the
    exception).

    `facts` are what the call established for the rest of the episode (e.g.
    {"user_verified": True}); the rollout engine adds them to the episode ledger,
    where policy conditions read them as `state`. A tool sets them by returning a
    ToolResult itself instead of a plain value."""

    content: str
    error: ErrorKind | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    images: tuple[Image, ...] = ()
    """Pictures the call returned (a crop, a rendered page), shown to the model with `content`."""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Task:
    """One problem an environment poses. `answer` is the reference used for scoring;
    `info` holds environment-specific facts (for `calc`: difficulty)."""

    id: str
    prompt: str
    answer: str
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def difficulty(self) -> str:
        return str(self.info.get("difficulty", "all"))


EventKind = Literal["tool_call", "invalid_call", "tool_error", "truncated", "infra_error", "gate_deny", "violation"]


@dataclass(frozen=True)
class Event:
    """Something that happened during an episode that rewards and metrics count.

    tool_call: a call decoded, validated and run; invalid_call: a call that failed to
    decode, named an unknown tool or broke its schema; tool_error: a valid call whose
    tool raised; truncated: the episode hit max turns or max tokens; gate_deny: a call
    the policy gate denied (detail: the rule ids); violation: a call the policy denies
    that ran anyway because the gate was in shadow mode (gate off in evaluation).
    """

    kind: EventKind
    turn: int
    detail: str = ""


@dataclass
class Episode:
    """The message-level record of one rollout, which is all a reward function sees."""

    task: Task
    messages: list[Message]
    events: list[Event] = field(default_factory=list)
    truncated: bool = False
    infra_error: str | None = None
    outcome: dict[str, Any] = field(default_factory=dict)
    """What the environment's session reported at the end (e.g. the final database state)."""
    response_tokens: int = 0
    """Tokens after the prompt (assistant turns and observations), as the token-level
    engine counted them; 0 where no token ids exist (a chat-completions endpoint)."""

    @property
    def final_text(self) -> str:
        """Content of the last assistant message, or "" if the model never answered."""
        for message in reversed(self.messages):
            if message.role == "assistant":
                return message.content
        return ""

    def count(self, kind: EventKind) -> int:
        return sum(1 for event in self.events if event.kind == kind)

    def denials_by_rule(self) -> dict[str, int]:
        """Policy denials (enforced or in shadow mode) per rule id; a call denied by two rules counts for both."""
        counts: dict[str, int] = {}
        for event in self.events:
            if event.kind in ("gate_deny", "violation"):
                for rule in filter(None, event.detail.split(",")):
                    counts[rule] = counts.get(rule, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": {"id": self.task.id, "prompt": self.task.prompt, "answer": self.task.answer, "info": self.task.info},
            "messages": [m.to_dict() for m in self.messages],
            "events": [{"kind": e.kind, "turn": e.turn, "detail": e.detail} for e in self.events],
            "truncated": self.truncated,
            "infra_error": self.infra_error,
            "outcome": self.outcome,
            "response_tokens": self.response_tokens,
        }

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Episode:
        """The episode `to_dict` wrote (tool call ids are not kept there)."""
        task = data["task"]
        return Episode(
            Task(task["id"], task["prompt"], task["answer"], dict(task.get("info", {}))),
            [Message.from_dict(m) for m in data["messages"]],
            [Event(e["kind"], int(e["turn"]), e.get("detail", "")) for e in data.get("events", ())],
            bool(data.get("truncated", False)),
            data.get("infra_error"),
            dict(data.get("outcome", {})),
            int(data.get("response_tokens", 0)),
        )
