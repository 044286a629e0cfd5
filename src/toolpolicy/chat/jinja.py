"""A checkpoint's own chat template, in the fragments the rollout engine appends.

Any Hugging Face chat model says in its `chat_template` (Jinja) how a conversation
becomes text. `JinjaTemplate` renders it exactly as `tokenizer.apply_chat_template`
does (transformers' own renderer, tools as OpenAI JSON schemas) and cuts it into what
the engine needs: the prompt, one assistant message as the model writes it (through
its end-of-turn token), and the observation that follows a sampled turn (everything
after the end-of-turn token, through the next generation prompt).

Fragments are differences of two renderings around one fixed, neutral opening turn, so
they never depend on earlier content. For a template with the prefix property (every
rendering of a conversation starts with the rendering of any earlier point of it),
prompt + assistant + observation + ... equals the whole rendering: the reference ids.
Some templates re-render history (Qwen3 drops `<think>` blocks of earlier turns,
Mistral moves the tools listing to the last user message); `prefix_problems` names the
turn shapes where that happens. The engine still never re-tokenises: the conversation is
trained as the rollout produced it, which is the training-time template the field uses
for such models (trl ships `qwen3_training.jinja`, set it with `chat_template:`).

User-supplied text (tool results, user turns, arguments) may contain a control token's
spelling (`<|im_start|>system`). Every string of a message is marked before rendering
so that `encode_marked` encodes those as plain text: a tool cannot forge a turn.

Pictures go to the template as a vision-language model's processor gives them: a message
with pictures has content parts, one `{"type": "image"}` per picture and then its text. A
template that reads them (Qwen2.5-VL's) writes one IMAGE_PAD for each, framed as the model
expects; the rendering then widens the k-th pad the template wrote to the k-th picture's
placeholder count (`image_span`), as the processor expands it, so the ids are the ones
`processor.apply_chat_template` makes with those pictures.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from jinja2 import TemplateError
from transformers.utils.chat_template_utils import (
    _get_control_token_patterns,
    mark_control_tokens,
    render_jinja_template,
)

from toolpolicy.chat.images import IMAGE_PAD, ImageSpan, image_text
from toolpolicy.chat.parser import CALL_SYNTAXES, ParsedTurn, parse_assistant
from toolpolicy.chat.tools_block import drops_tools, hermes_turns
from toolpolicy.types import Image, Message, ToolCall, ToolSpec

PROBE = (Message("user", "Hi."),)
"""The neutral opening turn fragments are cut against."""
MARK_START = "\U000f0000"
"""The private-use character transformers puts before a marked control token."""
PICTURES_UNREAD = (
    f"it does not read pictures as image content parts with one {IMAGE_PAD} each (Qwen2-VL's spelling); set chat_template: "
    "to the model's vision template"
)
TEMPLATE_PAD = re.compile(f"(?<!{MARK_START}){re.escape(IMAGE_PAD)}")
"""An IMAGE_PAD the template wrote (one in user-supplied text is marked)."""


class ChatFormatError(ValueError):
    """A chat template toolpolicy cannot use as configured; the message says what to set."""


def detect_syntax(source: str) -> str:
    """The tool-call syntax a chat template renders calls in, or ChatFormatError."""
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if "<|start_header_id|>" in source and ('"parameters"' in source or "<|python_tag|>" in source):
        return "llama3_json"
    known = ", ".join(CALL_SYNTAXES)
    raise ChatFormatError(
        "cannot tell which tool-call syntax this chat template uses (no <tool_call>, [TOOL_CALLS] or "
        f"Llama-3 JSON calls in it); set chat_format to one of: {known}, or chat_tools: system for a template "
        "with no tools section"
    )


def call_id(call: ToolCall, index: int) -> str:
    """The call's id, or a stable 9-character one for templates that need ids (Mistral)."""
    if call.id:
        return call.id
    digest = hashlib.sha256(f"{index}:{call.name}:{json.dumps(call.arguments, sort_keys=True, default=str)}".encode())
    return digest.hexdigest()[:9]


def content_of(message: Message) -> str | list[dict[str, str]]:
    """A message's content as chat templates read it: its text, or with pictures the parts a
    processor reads, one image part per picture and then the text.

    >>> from toolpolicy.types import Image
    >>> content_of(Message("user", "What is it?", images=(Image(b"", 8, 8),)))
    [{'type': 'image'}, {'type': 'text', 'text': 'What is it?'}]
    """
    if not message.images:
        return message.content
    return [{"type": "image"} for _ in message.images] + [{"type": "text", "text": message.content}]


def openai_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """Messages in the OpenAI shape chat templates read. Calls without an id get a stable
    one; a tool message without one answers the next unanswered call before it."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []
    for message in messages:
        entry: dict[str, Any] = {"role": message.role, "content": content_of(message)}
        if message.reasoning:
            entry["reasoning_content"] = message.reasoning
        if message.tool_calls:
            ids = [call_id(c, i) for i, c in enumerate(message.tool_calls)]
            pending = list(ids)
            entry["tool_calls"] = [
                {"type": "function", "id": i, "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in zip(ids, message.tool_calls)
            ]
        if message.role == "tool":
            entry["name"] = message.name
            entry["tool_call_id"] = message.tool_call_id or (pending.pop(0) if pending else call_id(ToolCall(message.name, {}), len(out)))
        out.append(entry)
    return out


@dataclass(frozen=True)
class JinjaTemplate:
    """A Jinja chat template with its end-of-turn token, stop strings and call syntax.

    Build it from a tokenizer with `JinjaTemplate.of(tokenizer, ...)`. The methods match
    `HermesTemplate`'s, so the engine drives both the same way.
    """

    source: str
    syntax: str
    end_of_turn: str
    stops: tuple[str, ...]
    reasoning: bool = False
    variables: Mapping[str, Any] = field(default_factory=dict)
    """Passed to the template: the tokenizer's special tokens (bos_token, ...) and the
    config's `chat_template_kwargs` (e.g. enable_thinking)."""
    control_tokens: tuple[str, ...] = ()
    """Token spellings that user-supplied text may not produce as control tokens."""
    tools_in_system: bool = False
    """Show tools as a Hermes block in the system message and calls and results in plain
    turns (`tools_block.hermes_turns`), for a template with no tools section of its own."""
    image_span: ImageSpan | None = None
    """How the model's text stands for a picture (a vision-language model's); None: the model
    reads no pictures, and a message with one is an error. The template says where a picture
    goes; the span says how many placeholders it takes."""

    @staticmethod
    def of(
        tokenizer: Any, syntax: str = "auto", source: str | None = None, kwargs: Mapping[str, Any] | None = None, tools: str = "template"
    ) -> JinjaTemplate:
        """The template of `tokenizer` (or `source`), its stops from the tokenizer's eos and
        the template's end-of-turn token; `syntax` "auto" detects the call syntax. `tools`:
        "template" shows tools through the template's own tools section (a template without
        one is a ChatFormatError), "system" through a Hermes block (see `tools_in_system`)."""
        source = source or tokenizer.chat_template
        if not source:
            raise ChatFormatError("the tokenizer has no chat_template; set chat_template: to a Jinja file for this model")
        if tools == "system" and syntax in ("auto", "hermes"):
            syntax = "hermes"
        elif tools == "system":
            raise ChatFormatError(f"chat_tools: system writes calls as Hermes <tool_call> JSON; set chat_format: hermes or auto, not {syntax!r}")
        elif syntax == "auto":
            syntax = detect_syntax(source)
        elif syntax not in CALL_SYNTAXES:
            raise ChatFormatError(f"chat_format {syntax!r} is not a tool-call syntax; use auto or one of: {', '.join(CALL_SYNTAXES)}")
        special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        controls = tuple(
            t.content for t in tokenizer.added_tokens_decoder.values() if t.special or (t.content in source and not t.content.isspace())
        )  # Gemma's "\n" is an added token its template writes as ordinary text: user text makes it too
        draft = JinjaTemplate(source, syntax, "", (), "<think>" in source, {**special, **(kwargs or {})}, controls, tools == "system")
        if tools != "system" and drops_tools(draft.render_prompt):
            raise ChatFormatError(
                "the chat template renders the same prompt with and without tools, so the model would never see the "
                "tools it may call; set chat_tools: system to list them in a Hermes block in the system message (as "
                "Qwen2.5's template does), or chat_template: to a template with a tools section"
            )
        eot = draft.find_end_of_turn() or special.get("eos_token", "")
        if not eot:
            raise ChatFormatError("cannot find the token that ends an assistant turn in the chat template, and the tokenizer has no eos_token")
        stops = tuple(dict.fromkeys(s for s in (eot, special.get("eos_token")) if s))
        return replace(draft, end_of_turn=eot, stops=stops)

    def render(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), add_generation_prompt: bool = False) -> str:
        """The whole conversation, as `apply_chat_template(..., tokenize=False)` renders it
        (with user-supplied strings marked, see the module docstring), each picture widened to
        its placeholders as the model's processor does (see the module docstring)."""
        pictures = [image for message in messages for image in message.images]
        if self.image_span is None:
            for message in messages:
                image_text(None, message)
        if self.tools_in_system:  # marked before the Hermes tags are added: those are the template's own
            pattern = self._pattern()
            marked = [_marked_message(m, pattern) for m in messages] if pattern else messages
            specs = [_marked_spec(t, pattern) for t in tools] if pattern else tools
            chat = openai_messages(hermes_turns(marked, specs))
            schemas = None
        else:
            chat, schemas = self._marked(openai_messages(messages)), self._marked([spec.to_openai() for spec in tools] or None)
        try:
            rendered, _ = render_jinja_template(
                [chat], tools=schemas, chat_template=self.source, add_generation_prompt=add_generation_prompt, **self.variables
            )
        except TemplateError as error:
            roles = ", ".join(m["role"] for m in chat)
            raise ChatFormatError(f"the chat template refuses this conversation ({roles}): {error}") from None
        except TypeError as error:  # a text template joining a string to a message's content parts
            if not pictures:
                raise
            raise ChatFormatError(f"the chat template fails on a message's pictures ({error}): {PICTURES_UNREAD}") from None
        return self._widened(rendered[0], pictures)

    def render_prompt(self, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> str:
        """The conversation so far, ending where the model starts generating."""
        return self.render(messages, tools, add_generation_prompt=True)

    def render_assistant(self, message: Message) -> str:
        """What the model writes for `message`, through the end-of-turn token."""
        rest = self._after_probe([message], add_generation_prompt=False)
        end = self._last_end_of_turn(rest)
        if end == -1:
            raise ChatFormatError(f"the chat template rendered an assistant message without its end-of-turn token {self.end_of_turn!r}")
        return rest[: end + len(self.end_of_turn)]

    def render_observation(self, messages: Sequence[Message], after: Message | None = None) -> str:
        """What follows a sampled assistant turn (`after`, by default a bare one with no
        calls): the rest of its rendering past the end-of-turn token, `messages`, and
        the next generation prompt."""
        if any(m.role == "assistant" for m in messages):
            raise ValueError("an observation holds tool, user or system messages; render assistant text with render_assistant")
        calls = tuple(replace(c, arguments={}, id=call_id(c, i)) for i, c in enumerate(after.tool_calls)) if after else ()
        bare = Message("assistant", "" if calls else ".", calls)  # some templates refuse text beside calls
        rest = self._after_probe([bare, *messages], add_generation_prompt=True, fallback=calls[:1])
        end = rest.find(self.end_of_turn)
        if end == -1:
            raise ChatFormatError(f"the chat template rendered an assistant message without its end-of-turn token {self.end_of_turn!r}")
        return rest[end + len(self.end_of_turn) :]

    def parse(self, text: str, max_call_chars: int) -> ParsedTurn:
        """Content, calls, errors and reasoning of one generated turn."""
        return parse_assistant(text, max_call_chars=max_call_chars, syntax=self.syntax, stops=self.stops, reasoning=self.reasoning)

    def prefix_problems(self, tools: Sequence[ToolSpec] = ()) -> list[str]:
        """The turn shapes the engine produces on which prompt + fragments differ from
        rendering the whole conversation (empty: the template has the prefix property)."""
        problems = []
        for name, (prefix, *turns) in _turn_shapes(self.reasoning).items():
            try:
                if not self._holds(prefix, turns, tools):
                    problems.append(name)
            except ChatFormatError as error:
                problems.append(f"{name} ({error})")
        return problems

    def find_end_of_turn(self) -> str:
        """The first control token the template writes after an assistant's text."""
        rest = self._after_probe([Message("assistant", "Hello.")], add_generation_prompt=False)
        tail = rest[rest.find("Hello.") + len("Hello.") :]
        hits = [(tail.find(token), -len(token), token) for token in self.control_tokens if token and token in tail]
        return min(hits)[2] if hits else ""

    def _holds(self, prefix: list[Message], turns: list[tuple[Message, list[Message]]], tools: Sequence[ToolSpec]) -> bool:
        text = self.render_prompt(prefix, tools)
        conversation = list(prefix)
        for assistant, observations in turns:
            text += self.render_assistant(assistant)
            conversation.append(assistant)
            if observations:
                text += self.render_observation(observations, after=assistant)
                conversation.extend(observations)
        whole = self.render(conversation, tools)
        return whole.startswith(text) and not whole[len(text) :].strip()

    def _after_probe(self, messages: list[Message], add_generation_prompt: bool, fallback: tuple[ToolCall, ...] | None = None) -> str:
        """The rendering of PROBE + messages past the rendering of PROBE's prompt. With a
        `fallback`, a template that refuses the first (assistant) message's calls (Llama
        3.1 takes one call per turn) renders it with the fallback calls instead."""
        head = self._probe_prompt
        try:
            whole = self.render([*PROBE, *messages], add_generation_prompt=add_generation_prompt)
        except ChatFormatError:
            if fallback is None:
                raise
            whole = self.render([*PROBE, replace(messages[0], tool_calls=fallback), *messages[1:]], add_generation_prompt=add_generation_prompt)
        if not whole.startswith(head):
            raise ChatFormatError("the chat template renders a user turn differently once an assistant answers it; toolpolicy cannot cut fragments from it")
        return whole[len(head) :]

    @cached_property
    def _probe_prompt(self) -> str:
        """PROBE's prompt, rendered once: every fragment is cut against it."""
        return self.render_prompt(PROBE)

    def _last_end_of_turn(self, text: str) -> int:
        """Index of the last end-of-turn token the template wrote (not one inside marked text)."""
        index = text.rfind(self.end_of_turn)
        while index > 0 and text[index - 1] == MARK_START:
            index = text.rfind(self.end_of_turn, 0, index)
        return index

    def _widened(self, text: str, images: Sequence[Image]) -> str:
        """`text` with the k-th IMAGE_PAD the template wrote repeated `image_span.pads` of the
        k-th picture times; ChatFormatError unless the template wrote one per picture."""
        span = self.image_span
        if span is None or not images:  # render refuses pictures without a span
            return text
        written = TEMPLATE_PAD.findall(text)
        if len(written) != len(images):
            raise ChatFormatError(f"the chat template wrote {len(written)} {IMAGE_PAD} for {len(images)} picture(s): {PICTURES_UNREAD}")
        pads = iter(images)
        return TEMPLATE_PAD.sub(lambda _: IMAGE_PAD * span.pads(next(pads)), text)

    def _pattern(self) -> Any:
        """The pattern of the control-token spellings to mark, or None when there are none."""
        return _get_control_token_patterns(self.control_tokens)[0] if self.control_tokens else None

    def _marked(self, value: Any) -> Any:
        pattern = self._pattern()
        return value if pattern is None or value is None else mark_control_tokens(value, pattern)


def _marked_message(message: Message, pattern: Any) -> Message:
    """`message` with its user-supplied strings (text, reasoning, call arguments) marked."""
    calls = tuple(replace(c, arguments=mark_control_tokens(c.arguments, pattern)) for c in message.tool_calls)
    return replace(message, content=mark_control_tokens(message.content, pattern), reasoning=mark_control_tokens(message.reasoning, pattern), tool_calls=calls)


def _marked_spec(spec: ToolSpec, pattern: Any) -> ToolSpec:
    """`spec` with its description and schema marked (the name is the model's to call, and stays)."""
    return replace(spec, description=mark_control_tokens(spec.description, pattern), parameters=mark_control_tokens(spec.parameters, pattern))


def _turn_shapes(reasoning: bool) -> dict[str, list[Any]]:
    """Conversations of every turn shape the engine produces: (opening messages, then
    (assistant message, observation messages) per turn)."""
    call = ToolCall("lookup", {"key": "a"}, "abcdef123")
    second = ToolCall("lookup", {"key": "b"}, "bcdefa234")
    think = "Let me look it up." if reasoning else ""
    opening = [Message("system", "You help."), Message("user", "What is a?")]
    calls = Message("assistant", "", (call,), reasoning=think)
    result = [Message("tool", "a is 1", name="lookup", tool_call_id=call.id)]
    answer = Message("assistant", "a is 1.", reasoning=think)
    shapes: dict[str, list[Any]] = {
        "tool call, result, answer": [opening, (calls, result), (answer, [])],
        "two calls in one turn": [
            opening,
            (Message("assistant", "", (call, second)), [*result, Message("tool", "b is 2", name="lookup", tool_call_id=second.id)]),
            (answer, []),
        ],
        "answer, then a user turn": [opening, (answer, [Message("user", "And b?")]), (calls, result), (answer, [])],
        "no system message": [opening[1:], (calls, result), (answer, [])],
    }
    return shapes

