"""Episodes against any OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp, ...).

A served model is evaluated on the same environments, gate, tools and rewards as a
local one; only the loop's first step differs. The server applies its own chat
template and returns tool calls already decoded, so this loop works at message
level: it keeps each episode's conversation exactly as it went over the wire (the
server's assistant messages verbatim, one `tool` message per call id) and never
sees token ids. Token ids stay the truth for training (docs/architecture.md, contract 1); this
path is for evaluation and for driving a simulated user.

Each decoded call goes through `engine.act`, so gate decisions, tool errors,
ledger facts and events are the same as in `RolloutEngine`. A call whose
arguments are not a JSON object becomes an `invalid_call` observation answered
under its call id. An endpoint that fails after its retries marks the episode as
an infrastructure error (excluded from scores, docs/architecture.md, contract 4).

    client = ChatClient(Endpoint("http://localhost:8000/v1", "Qwen2.5-7B-Instruct"))
    rollouts = ChatEngine(env, client, EpisodeLimits(max_turns=8)).run(tasks)
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
from toolpolicy.chat import ParsedTurn
from toolpolicy.envs.base import Env, Session
from toolpolicy.gate import Gate, Ledger
from toolpolicy.rollout.engine import Figures, GatedLoop, EpisodeLimits, act, episode_gate, opening_ledger, record_turn, truncate
from toolpolicy.types import CallError, Episode, Message, Task, ToolCall

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Endpoint:
    """Where the model is served and how to sample from it."""

    base_url: str
    """e.g. http://localhost:8000/v1 (the part before /chat/completions)."""
    model: str
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key; unset means no Authorization header."""
    temperature: float = 1.0
    max_tokens: int = 512
    """Tokens one assistant turn may generate."""
    timeout: float = 60.0
    retries: int = 3
    """Retries of a request that failed for a transient reason (connection, 429, 5xx)."""
    concurrency: int = 8
    """Requests in flight at once."""


class EndpointError(RuntimeError):
    """The endpoint could not give an answer: an infrastructure failure, not the model's."""


@dataclass(frozen=True)
class Reply:
    message: dict[str, Any]
    finish_reason: str
    completion_tokens: int


class ChatClient:
    """POSTs chat-completions requests with retries; one instance is safe to share across threads."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        headers = {"Content-Type": "application/json"}
        if key := os.environ.get(endpoint.api_key_env):
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(base_url=endpoint.base_url.rstrip("/"), headers=headers, timeout=endpoint.timeout)

    def close(self) -> None:
        self._http.close()

    def complete(self, wire: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        """The assistant's next message for the conversation `wire`; EndpointError on failure."""
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": wire,
            "temperature": self.endpoint.temperature,
            "max_tokens": self.endpoint.max_tokens,
        }
        if tools:
            body["tools"] = tools
        response = send(self._http, "POST", "/chat/completions", body, self.endpoint.retries, 0.25)
        if response.status_code != 200:
            raise EndpointError(f"{self.endpoint.base_url}: HTTP {response.status_code}: {response.text[:300]}")
        return parse_response(response, self.endpoint.base_url)


def send(http: httpx.Client, method: str, path: str, body: Any, retries: int, backoff: float) -> httpx.Response:
    """The first answer that is not a transient failure (a connection error, 408, 429, 5xx),
    retrying up to `retries` times after backoff * 2^attempt seconds (at most 8); EndpointError
    when every attempt failed."""
    problem = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(8.0, backoff * 2**attempt))
        try:
            response = http.request(method, path, json=body)
        except httpx.HTTPError as error:
            problem = f"{type(error).__name__}: {error}"
            continue
        if response.status_code in RETRY_STATUS:
            problem = f"HTTP {response.status_code}: {response.text[:200]}"
            continue
        return response
    raise EndpointError(f"{str(http.base_url).rstrip('/')}{path}: no answer after {retries + 1} attempts ({problem})")


def parse_response(response: httpx.Response, where: str) -> Reply:
    """The first choice of a chat-completions response; EndpointError if it has another shape."""
    try:
        data = response.json()
        choice = data["choices"][0]
        message = choice["message"]
        if not isinstance(message, dict):
            raise TypeError("message is not an object")
    except (ValueError, KeyError, IndexError, TypeError) as error:
        raise EndpointError(f"{where}: not a chat-completions response ({error}): {response.text[:200]}") from None
    usage = data.get("usage") or {}
    return Reply(message, str(choice.get("finish_reason") or "stop"), int(usage.get("completion_tokens") or 0))


def decode_reply(message: dict[str, Any], turn: int, max_call_chars: int) -> tuple[ParsedTurn, list[dict[str, Any]]]:
    """The server's assistant message as a ParsedTurn, and its tool calls as they go back on the wire.

    Every call keeps (or, if the server gave none, gets) an id, so that its observation
    answers it even when its arguments could not be decoded.
    """
    calls: list[ToolCall] = []
    errors: list[CallError] = []
    wire_calls: list[dict[str, Any]] = []
    for k, raw in enumerate(message.get("tool_calls") or ()):
        raw = raw if isinstance(raw, dict) else {}
        function = raw.get("function") if isinstance(raw.get("function"), dict) else {}
        call_id = str(raw.get("id") or f"call_{turn}_{k}")
        name, arguments = function.get("name"), function.get("arguments", "{}")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments)
        wire_calls.append({"id": call_id, "type": "function", "function": {"name": str(name or ""), "arguments": text}})
        decoded = _decode_call(name, text, call_id, max_call_chars)
        (calls if isinstance(decoded, ToolCall) else errors).append(decoded)  # type: ignore[arg-type]
    content = message.get("content")
    return ParsedTurn(content if isinstance(content, str) else "", tuple(calls), tuple(errors)), wire_calls


def _decode_call(name: Any, text: str, call_id: str, max_call_chars: int) -> ToolCall | CallError:
    if not isinstance(name, str) or not name:
        return CallError("missing_name", "The tool call has no function name.", text[:200], call_id)
    if len(text) > max_call_chars:
        message = f"The arguments of {name} are {len(text)} characters; the limit is {max_call_chars}."
        return CallError("too_long", message, text[:200], call_id)
    try:
        arguments = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as error:
        message = f"The arguments of {name} are not valid JSON ({error.msg} at character {error.pos})."
        return CallError("bad_json", message, text[:200], call_id)
    if not isinstance(arguments, dict):
        return CallError("not_an_object", f"The arguments of {name} must be a JSON object.", text[:200], call_id)
    return ToolCall(name, arguments, call_id)


def to_wire(message: Message) -> dict[str, Any]:
    """A system, user or tool message in the chat-completions shape."""
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    return {"role": message.role, "content": message.content}


@dataclass
class ChatRollout:
    """One episode run against an endpoint: the episode, the conversation as sent, tokens generated."""

    episode: Episode
    wire: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    """The tools offered to the endpoint: the environment's for this task (`Env.task_specs`)."""
    ledger: Ledger = field(default_factory=Ledger)
    completion_tokens: int = 0


class ChatEngine(GatedLoop):
    """The multi-turn loop of `RolloutEngine` for a chat-completions endpoint."""

    def __init__(self, env: Env, client: ChatClient, limits: EpisodeLimits, gate: Gate | None = None) -> None:
        super().__init__(env, gate, limits)
        self.client = client

    def run(self, tasks: list[Task], progress: str | None = None, figures: Figures | None = None) -> list[ChatRollout]:
        """One episode per task (repeat a task to run several trials)."""
        rollouts = []
        for task in tasks:
            messages = self.env.initial_messages(task)
            tools = [spec.to_openai() for spec in self.env.task_specs(task)]
            rollouts.append(ChatRollout(Episode(task, list(messages)), [to_wire(m) for m in messages], tools, opening_ledger(task)))
        with ThreadPoolExecutor(max_workers=max(1, self.client.endpoint.concurrency)) as pool:

            def take_turn(sessions: list[Session], live: list[int], turn: int) -> list[bool]:
                replies = list(pool.map(self._ask, [rollouts[i] for i in live]))
                return [self._advance(rollouts[i], sessions[i], reply, turn) for i, reply in zip(live, replies)]

            self.loop([r.episode for r in rollouts], take_turn, progress, figures)
        return rollouts

    def _ask(self, rollout: ChatRollout) -> Reply | EndpointError:
        try:
            return self.client.complete(rollout.wire, rollout.tools)
        except EndpointError as error:
            return error

    def _advance(self, rollout: ChatRollout, session: Session, reply: Reply | EndpointError, turn: int) -> bool:
        """Record one assistant turn and its observations; return whether the episode goes on."""
        episode = rollout.episode
        if isinstance(reply, EndpointError):
            episode.infra_error = str(reply)
            return False
        rollout.completion_tokens += reply.completion_tokens
        parsed, wire_calls = decode_reply(reply.message, turn, self.limits.max_call_chars)
        rollout.wire.append({"role": "assistant", "content": parsed.content, **({"tool_calls": wire_calls} if wire_calls else {})})
        if reply.finish_reason == "length":
            episode.messages.append(Message("assistant", parsed.content, parsed.tool_calls))
            truncate(episode, turn, "max_turn_tokens")
            return False
        acted = act(parsed, parsed.content, session, episode_gate(self.gate, self.env, episode.task), rollout.ledger, turn)
        observations = record_turn(episode, session, *acted)
        if observations is None:
            return False
        episode.messages.extend(observations)
        rollout.wire.extend(to_wire(m) for m in observations)
        return True


END_OF_CONVERSATION = "###END###"


class EndpointUser:
    """A simulated user played by a served model: it reads the conversation from the
    user's side (the agent's messages are its input, its own earlier replies its output;
    tool traffic is hidden) and answers from a scenario brief.

    It ends the conversation by replying END_OF_CONVERSATION (the brief tells it how)
    or after `max_replies`. An endpoint failure ends the conversation too and is kept
    in `error`, so an environment can report it as an infrastructure failure.
    """

    def __init__(self, client: ChatClient, brief: str, max_replies: int = 4) -> None:
        self.client = client
        self.system = (
            f"{brief}\n\nYou are the user, not the assistant. When your request is settled or nothing is asked "
            f"of you, reply with exactly {END_OF_CONVERSATION} and nothing else."
        )
        self.left = max_replies
        self.error: str | None = None

    def reply(self, messages: list[Message]) -> str | None:
        if self.left <= 0 or self.error is not None:
            return None
        self.left -= 1
        wire = [{"role": "system", "content": self.system}]
        for message in messages:
            if message.role == "assistant" and message.content.strip():
                wire.append({"role": "user", "content": message.content})
            elif message.role == "user":
                wire.append({"role": "assistant", "content": message.content})
        try:
            text = self.client.complete(wire, []).message.get("content") or ""
        except EndpointError as error:
            self.error = str(error)
            return None
        text = text.strip()
        return None if not text or END_OF_CONVERSATION in text else text
