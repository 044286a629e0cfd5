"""The trajectory viewer: sample episodes (eval/<name>_samples.jsonl) rendered as a chat.

An episode reads top to bottom the way the model lived it: the system prompt
collapsed, the user's question, each assistant turn with its tool calls in a
highlighted box (tool name and pretty-printed JSON arguments), each tool output
in a box of its own, and badges for what went wrong on that turn (invalid call,
tool error, gate denial). The header says difficulty, correct or not, reward and
truncation. Every string that came from a model, a tool or a task is escaped.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

from toolpolicy.report.comparison import order_difficulties
from toolpolicy.report.plots import difficulty_colour

EVENT_BADGES = {
    "invalid_call": ("invalid call", "bad"),
    "tool_error": ("tool error", "warn"),
    "gate_deny": ("denied by gate", "bad"),
    "truncated": ("truncated", "trunc"),
    "infra_error": ("infra error", "infra"),
}
"""event kind -> (badge text, css class). "tool_call" events need no badge: the call box shows them."""


def difficulty_of(sample: dict[str, Any]) -> str:
    info = (sample.get("task") or {}).get("info") or {}
    return str(info.get("difficulty", "all"))


def pick_samples(samples: list[dict[str, Any]], limit: int = 6) -> list[dict[str, Any]]:
    """A mix of up to `limit` episodes: round-robin over (difficulty, correct/incorrect) groups,
    easy before hard and correct before incorrect, file order within a group."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for sample in samples:
        outcome = {True: "correct", False: "incorrect"}.get(sample.get("correct"), "unscored")
        groups.setdefault((difficulty_of(sample), outcome), []).append(sample)
    order = order_difficulties({d for d, _ in groups})
    keys = sorted(groups, key=lambda k: (order.index(k[0]), ("correct", "incorrect", "unscored").index(k[1])))
    picked: list[dict[str, Any]] = []
    depth = 0
    while len(picked) < limit and any(depth < len(groups[k]) for k in keys):
        picked += [groups[k][depth] for k in keys if depth < len(groups[k])][: limit - len(picked)]
        depth += 1
    return picked


def render_episode(sample: dict[str, Any]) -> str:
    task = sample.get("task") or {}
    events = [e for e in sample.get("events") or [] if isinstance(e, dict)]
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for event in events:
        if event.get("kind") not in ("tool_call", "truncated"):  # shown by the call box / the header
            by_turn.setdefault(event.get("turn"), []).append(event)

    parts = [_header(sample, task), '<div class="chat">']
    assistant_turn = 0
    for message in sample.get("messages") or []:
        role = message.get("role")
        if role == "assistant":
            parts.append(_assistant(message, assistant_turn, by_turn.pop(assistant_turn, [])))
            assistant_turn += 1
        else:
            parts.append(_message(message))
    leftover = [event for turn_events in by_turn.values() for event in turn_events]
    if leftover:  # events whose turn matches no assistant message still get shown
        parts.append('<div class="events">' + "".join(_badge(e) for e in leftover) + "</div>")
    parts.append("</div>")
    return '<article class="episode">' + "".join(parts) + "</article>"


def _header(sample: dict[str, Any], task: dict[str, Any]) -> str:
    difficulty = difficulty_of(sample)
    bits = [f'<span class="tag" style="background:{difficulty_colour(difficulty)}">{escape(difficulty)}</span>']
    correct = sample.get("correct")
    if correct is True:
        bits.append('<span class="verdict ok">&#10003; correct</span>')
    elif correct is False:
        bits.append('<span class="verdict no">&#10007; incorrect</span>')
    reward = sample.get("reward")
    if isinstance(reward, (int, float)) and not isinstance(reward, bool):
        bits.append(f'<span class="reward">reward {reward:.2f}</span>')
    if sample.get("truncated"):
        bits.append(_badge({"kind": "truncated", "detail": ""}))
    if sample.get("infra_error"):
        bits.append(_badge({"kind": "infra_error", "detail": str(sample["infra_error"])}))
    bits.append(f'<span class="task-id">task {escape(str(task.get("id", "?")))}</span>')
    answer = f'<div class="answer">reference answer: <code>{escape(str(task.get("answer", "")))}</code></div>'
    return '<header class="episode-head">' + " ".join(bits) + "</header>" + answer


def _message(message: dict[str, Any]) -> str:
    role = str(message.get("role", "?"))
    content = escape(str(message.get("content", "")))
    if role == "system":
        return f'<details class="msg system"><summary>system prompt</summary><pre>{content}</pre></details>'
    if role == "tool":
        name = escape(str(message.get("name") or "tool"))
        return f'<div class="msg tool"><div class="who">tool output &middot; {name}</div><pre>{content}</pre></div>'
    css = "user" if role == "user" else "other"
    return f'<div class="msg {css}"><div class="who">{escape(role)}</div><div class="bubble">{content}</div></div>'


def _assistant(message: dict[str, Any], turn: int, events: list[dict[str, Any]]) -> str:
    parts = [f'<div class="msg assistant"><div class="who">assistant &middot; turn {turn}</div>']
    content = str(message.get("content", ""))
    if content.strip():
        parts.append(f'<div class="bubble">{escape(content)}</div>')
    for call in message.get("tool_calls") or []:
        name = escape(str(call.get("name", "?")))
        arguments = json.dumps(call.get("arguments", {}), indent=2, ensure_ascii=False, default=str)
        parts.append(f'<div class="call"><div class="call-head">tool call <code>{name}</code></div>'
                     f"<pre>{escape(arguments)}</pre></div>")
    if events:
        parts.append('<div class="events">' + "".join(_badge(e) for e in events) + "</div>")
    parts.append("</div>")
    return "".join(parts)


def _badge(event: dict[str, Any]) -> str:
    text, css = EVENT_BADGES.get(str(event.get("kind")), (str(event.get("kind")), "infra"))
    detail = str(event.get("detail") or "")
    shown = f' <span class="detail">{escape(detail[:200])}</span>' if detail else ""
    return f'<span class="badge {css}" title="{escape(detail)}">{escape(text)}{shown}</span>'
