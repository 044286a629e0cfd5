"""`bfcl`: BFCL v4's single-turn entries as an environment of toolpolicy's engine.

Each entry of the thirteen single-turn categories (single_data.CATEGORIES) is a task: its
messages are the prompt, its functions as BFCL shows them (`shown_functions`) the tools.
The model answers in one assistant turn and the episode ends there (`single_turn`): its
calls go through the gate, which checks them against the entry's own schemas, so a
malformed call is an `invalid_call` event, but nothing runs them (BFCL's single-turn
entries have no backends) and no observation follows. The rewards score the calls
(toolpolicy.rewards.bfcl), from the entry's scoring inputs the task carries in
`task.info["bfcl"]`:

    bfcl_correct       BFCL's verdict (`match_calls`, which agrees with the official
                       ast_checker on every case tried); irrelevance: no call passes;
                       relevance: any call passes                                    weight 1.0
    bfcl_param_values  ToolRL's credit for acceptable parameter values               weight 0.2
    bfcl_tool_name     ToolRL's credit for the called function names (Jaccard)       weight 0.1
    bfcl_param_names   ToolRL's credit for the parameter names (Jaccard)             weight 0.1
    bfcl_format        1 when no call was malformed                                  weight 0.1
    tool_call_count, invalid_call_count                                              metrics (0)

The verdict dominates: a right answer scores 1.5, a wrong one at most 0.5, so the partial
credit only orders the wrong answers of a GRPO group (a group where none is right still
has a signal, ToolRL's point), never lifts a wrong answer above a right one. A turn cut
by a budget, or broken by infrastructure, scores 0 on every component.

The split, with nothing of the held-out side in training. `train` is the live
categories (queries contributed by users: live_simple, live_multiple, live_parallel,
live_parallel_multiple, live_irrelevance, live_relevance); `eval` (also called `test`)
is the non-live ones (simple_python, simple_java, simple_javascript, multiple, parallel,
parallel_multiple, irrelevance). A live entry is dropped from `train` when its question
(the user text, lower-cased, letters and digits only) or the name of one of its functions
(as shown, lower-cased) also appears in a held-out entry; `leak_split` computes it,
`BfclEnv.dropped` says why for each, and tests/test_bfcl_env.py checks that every dropped
entry really shares one and no kept entry does. With bfcl-eval 2026.3.23 (DROPPED):

    category                entries  dropped  train   of which: question  function
    live_simple                 258       25    233                   0        25
    live_multiple              1053       53   1000                   1        53
    live_parallel                16       11      5                   0        11
    live_parallel_multiple       24        7     17                   0         7
    live_irrelevance            884      156    728                   6       156
    live_relevance               16        0     16                   0         0
    all live                   2251      252   1999                   7       252

Every question-sharing entry also shares a function (get_current_weather, most often: 200
live entries offer it, and so does a held-out one). The held-out split keeps all 1390
non-live entries (400 + 100 + 50 + 200 + 200 + 200 + 240).

`BfclOptions(categories)` keeps the entries of the named categories on both sides (the config's
`env.categories`); the drops are decided against every held-out entry whichever are kept.

Archived entries. bfcl-eval also ships, under `data/unused_datasets/`, categories of BFCL's
earlier versions that v4 scores in no category. Four of them (single_data.ARCHIVED_CATEGORIES:
exec_simple, exec_multiple, exec_parallel, exec_parallel_multiple) ask the kind of question the
non-live categories ask (Python functions of arithmetic, physics, finance, weather), their
answers written as calls (read by `single_data.executable_answer`). `BfclOptions(archived=True)`
(the config's `env.archived`) adds them to `train`, 6 left out whose answer cannot be read or
fits no checker (single_data.ARCHIVED_LEFT_OUT), the others dropped by the same rule as live
ones (ARCHIVED_DROPPED):

    category                entries  dropped  train   of which: question  function
    exec_simple                 100       32     68                   0        32
    exec_multiple                48       30     18                   0        30
    exec_parallel                49       15     34                   0        15
    exec_parallel_multiple       37       25     12                   0        25
    all archived                234      102    132                   0       102

Every drop shares a function name (the exec functions reappear in simple_python, multiple
and parallel: calculate_triangle_area, convert_currency, ...); no question is shared.

Composed entries. Half of BFCL's non-live AST categories ask for several calls in one turn
(parallel: one function called several times; parallel_multiple: several functions; of
their 400 entries, 224 expect three calls or more), but after the drops the live side has
22 such entries. `BfclOptions(composed=N, composed_calls=(2,))` (the config's `env.composed`,
`env.composed_calls`) adds N train entries, shared out over the numbers of calls named,
each made of that many kept live entries that offer the same functions (same schemas) and
expect one call each: the questions as one user message, one a line, every call expected
(`compose`). Tuples calling one function are `composed_parallel`, the others
`composed_parallel_multiple`, drawn half and half as far as each kind goes, each entry in
at most four tuples of a size (`composed_entries`). They are built from the train split
alone, so nothing of the held-out side enters, and scored like any entry: BFCL's verdict
on several expected calls, in any order.

Fewer functions. The held-out entries offer 1 to 4 functions (multiple: median 3), the
live ones up to 37, with long descriptions: of the 3,799 train entries of
examples/smollm2/bfcl.yaml, 1,957 have a prompt over its 1,024 tokens and SFT leaves them
out. `BfclOptions(max_functions=N)` (the config's `env.max_functions`) offers each train entry
at most N of its functions: those its expected calls name, then others drawn by its id
(`fewer_functions`); the answer is the same, and an irrelevance entry still offers only
functions that cannot serve it.

The gate knows one schema per function name, but entries show one name with different
schemas (requests_get in 46 forms): the gate admits a call that fits one of them
(`gate_tools`) and the episode's own tools then hold it to its entry's (`entry_tools`);
either refusal is an `invalid_call`. Both check the shown schema with no argument beyond
its properties and without `enum`s, which BFCL's checker does not read. The possible
answers of 7 train entries still break their schema's types (a boolean or an integer for
a string, a null date: live_multiple_552-153-1, 595-158-1, 596-158-2, 731-167-2,
733-167-4, 735-167-6, 1038-265-0): BFCL accepts them, so they are right (bfcl_correct 1)
and malformed (bfcl_format 0) at once.

The SFT demonstrator (`bfcl`, envs/bfcl/demonstrator.py) writes one answer per
entry from its possible answers. BFCL's checker accepts 1994 of the 1999 train ones; the
other 5 are the entries whose possible answer cannot be written as a passing call
(eval.bfcl_agreement.INTENDED_ANSWER_REJECTED: a required parameter without an acceptable
value, a parameter the function does not take).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache, cached_property
from typing import Any

from toolpolicy.errors import ConfigError
from toolpolicy.envs.base import Env, Session, cycled_draw
from toolpolicy.envs.bfcl.single_data import (
    ARCHIVED_CATEGORIES, CATEGORIES, CATEGORY_GROUPS, Category, Entry, known_categories, load_archived, load_v4, shown_name,
)
from toolpolicy.tools import ToolSet
from toolpolicy.tools.schema_tool import schema_tool
from toolpolicy.types import Message, Task, ToolSpec

TRAIN_CATEGORIES = CATEGORY_GROUPS["live"]
"""The live categories: BFCL's user-contributed queries, the `train` split."""
HELD_OUT_CATEGORIES = CATEGORY_GROUPS["non_live"]
"""The non-live categories: the `eval` split (`test` is the same)."""
SPLITS = {"train": "train", "eval": "eval", "test": "eval"}

DROPPED = {"live_simple": 25, "live_multiple": 53, "live_parallel": 11, "live_parallel_multiple": 7, "live_irrelevance": 156}
"""Live entries dropped from `train` per category, as the module docstring tables them (a test
compares it with `leak_split`'s count, so a new bfcl-eval that changes them is noticed)."""

ARCHIVED_DROPPED = {"exec_simple": 32, "exec_multiple": 30, "exec_parallel": 15, "exec_parallel_multiple": 25}
"""Archived entries dropped from `train` per category (the docstring's second table), checked like DROPPED."""

NOT_RUN = "Not run: BFCL's single-turn calls are scored, not executed."
"""What a call returns (nothing shows it: the episode ends with the turn that made it)."""


def question_key(entry: Entry) -> str:
    """The user's text of an entry, lower-cased, letters and digits only, single-spaced
    (Unicode letters kept: some live questions are in Chinese or Korean)."""
    text = " ".join(m.content for m in entry.messages if m.role == "user")
    return " ".join(re.sub(r"[\W_]+", " ", text.lower()).split())


def function_keys(entry: Entry) -> set[str]:
    """The entry's function names as the model is shown them, lower-cased."""
    return {shown_name(f["name"]).lower() for f in entry.functions}


@dataclass(frozen=True)
class Split:
    """The live entries kept for training, the held-out (non-live) ones, and why each dropped one went."""

    train: tuple[Entry, ...]
    held_out: tuple[Entry, ...]
    dropped: dict[str, tuple[str, ...]]
    """Live entry id -> what it shares with the held-out split: "question", "function NAME", ..."""

    def counts(self) -> dict[str, Counter[str]]:
        """Per train category (each live one, and the archived ones read): its entries, those
        dropped and those kept, and the drops sharing a question / a function."""
        out: dict[str, Counter[str]] = {c: Counter() for c in TRAIN_CATEGORIES}
        for entry in self.train:
            out.setdefault(entry.category, Counter()).update(entries=1, train=1)
        for entry_id, reasons in self.dropped.items():
            category = train_category(entry_id)
            out.setdefault(category, Counter()).update(entries=1, dropped=1)
            out[category].update({"question": 1} if "question" in reasons else {})
            out[category].update({"function": 1} if any(r.startswith("function ") for r in reasons) else {})
        return out


def train_category(entry_id: str) -> str:
    """The category of a live or archived entry from its id ("live_multiple_12-4-0" -> "live_multiple")."""
    return next(c for c in sorted(TRAIN_CATEGORIES + ARCHIVED_CATEGORIES, key=len, reverse=True) if entry_id.startswith(c + "_"))


def leak_split(entries: list[Entry]) -> Split:
    """Live (and archived) entries against the non-live ones: drop each whose question or a
    function name appears on the held-out side (see the module docstring)."""
    held_out = tuple(e for e in entries if e.category in HELD_OUT_CATEGORIES)
    questions = {question_key(e) for e in held_out} - {""}
    functions = set().union(*(function_keys(e) for e in held_out))
    train, dropped = [], {}
    for entry in (e for e in entries if e.category not in HELD_OUT_CATEGORIES):
        reasons = (("question",) if question_key(entry) in questions else ()) + tuple(
            f"function {name}" for name in sorted(function_keys(entry) & functions)
        )
        if reasons:
            dropped[entry.id] = reasons
        else:
            train.append(entry)
    return Split(tuple(train), held_out, dropped)


@cache
def v4_split(archived: bool = False) -> Split:
    """`leak_split` of every single-turn entry of the installed bfcl-eval (with `archived`, and
    of every archived one: `load_archived`), read once per process."""
    return leak_split(load_v4(CATEGORIES) + (load_archived() if archived else []))


def entry_task(entry: Entry) -> Task:
    """An entry as a task: its last user message as the prompt, its category, and in
    `info["bfcl"]` what the rewards score it with (`Entry.scoring()` and, as "names", the
    shown function names that differ from the functions' own)."""
    users = [m.content for m in entry.messages if m.role == "user"]
    info = {"category": entry.category, "bfcl": {**entry.scoring(), "names": entry.own_names()}}
    return Task(entry.id, users[-1] if users else "", "", info)


COMPOSED_CATEGORIES = ("composed_parallel", "composed_parallel_multiple")


def function_list(entry: Entry) -> str:
    """The functions an entry offers, as a key: entries with the same key offer the same schemas."""
    return json.dumps(entry.functions, sort_keys=True)


def composable(entry: Entry) -> bool:
    """An entry `compose` can join: an AST entry expecting exactly one call, asked in one user
    message and nothing else."""
    return entry.kind == "ast" and len(entry.expected) == 1 and [m.role for m in entry.messages] == ["user"]


def called(entry: Entry) -> str:
    """The function a composable entry's one expected call names."""
    return next(iter(entry.expected[0]))


ORDINALS = ("First", "Second", "Third", "Fourth", "Fifth", "Sixth", "Seventh", "Eighth", "Ninth", "Tenth")
NUMBERS = {2: "two", 3: "three", 4: "four"}
OPENINGS: tuple[Callable[[int], list[str]], ...] = (
    lambda n: [""] * n,
    lambda n: ["", *(["Also,"] * (n - 1))],
    lambda n: [f"{ORDINALS[i]}," if i < len(ORDINALS) else "Next," for i in range(n)],
    lambda n: ["First,", *(["Then,"] * (n - 2)), "Finally,"],
    lambda n: [f"I need help with {NUMBERS.get(n, n)} things. First,", *(["Next,"] * (n - 2)), "Lastly,"],
)
"""The openings of a prose entry's questions, one sequence per way of asking (`prose`)."""


def prose(questions: list[str], rng: random.Random) -> str:
    """`questions` as one paragraph, the way the held-out parallel entries ask ("First, ...
    Then, ... Finally, ..."), one of `OPENINGS` chosen by `rng`: each question with its
    whitespace made single spaces, ended by a stop if it has none, after its opening (its
    first letter lowered after one, unless the word is I or in capitals: I'm, NASA)."""
    parts = []
    for opening, question in zip(rng.choice(OPENINGS)(len(questions)), questions):
        text = " ".join(question.split())
        text = text if text[-1:] in ".?!" else text + "."
        first = text.split(" ", 1)[0]
        if opening and first != "I" and not (len(first) > 1 and first.isupper()):
            text = text[0].lower() + text[1:]
        parts.append(f"{opening} {text}" if opening else text)
    return " ".join(parts)


def lines(questions: list[str], rng: random.Random) -> str:
    """`questions` one a line."""
    return "\n".join(questions)


COMPOSED_STYLES: dict[str, Callable[[list[str], random.Random], str]] = {"lines": lines, "prose": prose}
"""How a composed entry asks its questions (the config's `env.composed_style`)."""


def compose(*entries: Entry, style: str = "lines") -> Entry:
    """One entry asking every question of `entries` in `style` (COMPOSED_STYLES, seeded by
    their ids), expecting all their calls (they offer the same functions)."""
    first = entries[0]
    same = len({called(e) for e in entries}) == 1
    entry_id = "composed_" + "+".join(e.id for e in entries)
    questions = [e.messages[0].content for e in entries]
    return Entry(
        id=entry_id,
        category=COMPOSED_CATEGORIES[0] if same else COMPOSED_CATEGORIES[1],
        messages=[Message("user", COMPOSED_STYLES[style](questions, random.Random(entry_id)))],
        functions=first.functions,
        expected=[call for e in entries for call in e.expected],
        language=first.language,
        shown=first.shown,
    )


def composed_entries(
    train: tuple[Entry, ...] | list[Entry], n: int, seed: int = 0, calls: tuple[int, ...] = (2,), style: str = "lines"
) -> list[Entry]:
    """`n` composed entries (`compose`, asking in `style`) of train entries offering the same
    functions with different questions, shared out evenly over the numbers of calls in `calls`
    (the first sizes take what does not divide). Of each size, half call one function every
    time (`composed_parallel`), as far as such tuples go; each entry is in at most four tuples
    of one size (`_spread`). The same `n`, `seed` and `calls` give the same entries, in
    either style."""
    if style not in COMPOSED_STYLES:
        raise ConfigError(f"field 'env.composed_style': {style!r} is not one of {', '.join(COMPOSED_STYLES)}")
    if n <= 0:
        return []
    groups: dict[str, list[Entry]] = {}
    for entry in sorted((e for e in train if composable(e)), key=lambda e: e.id):
        groups.setdefault(function_list(entry), []).append(entry)
    shares = [n // len(calls) + (i < n % len(calls)) for i in range(len(calls))]
    return [
        entry
        for size, share in zip(calls, shares)
        for entry in _composed_of_size(list(groups.values()), size, share, seed, style)
    ]


def _composed_of_size(groups: list[list[Entry]], size: int, n: int, seed: int, style: str) -> list[Entry]:
    """`n` composed entries of `size` calls each from `groups` (entries offering the same
    functions): every pair for two calls, shuffled chunks for more (`_tuples`)."""
    if size < 2:
        raise ConfigError(f"field 'env.composed_calls': {size} is not a number of calls to compose; use 2 or more")
    rng = random.Random(f"bfcl/composed/{seed}" + (f"/{size}" if size > 2 else ""))
    found: dict[bool, list[tuple[Entry, ...]]] = {True: [], False: []}
    for group in groups:
        for chosen in _tuples(group, size, rng):
            if len({question_key(e) for e in chosen}) == size:
                found[len({called(e) for e in chosen}) == 1].append(chosen)
    for kind in found.values():
        rng.shuffle(kind)
    uses: Counter[str] = Counter()
    spread = {kind: _spread(tuples, uses) for kind, tuples in found.items()}
    same = min(len(spread[True]), max(n // 2, n - len(spread[False])))
    chosen = spread[True][:same] + spread[False][: n - same]
    if len(chosen) < n:
        raise ConfigError(
            f"field 'env.composed': {n} entries of {size} calls asked, but the train split has {len(chosen)} "
            "composable tuples of that size; ask for fewer, or spread them over more sizes (env.composed_calls)"
        )
    return [compose(*(tuple_ if rng.random() < 0.5 else tuple_[::-1]), style=style) for tuple_ in chosen]


def _tuples(group: list[Entry], size: int, rng: random.Random, rounds: int = 4) -> list[tuple[Entry, ...]]:
    """Candidate tuples of `size` entries of one group: every pair for two; for more, the
    entries shuffled `rounds` times and cut in chunks, and the same again within each
    function's own entries (so tuples calling one function appear wherever a group has them)."""
    if size == 2:
        return [(first, second) for i, first in enumerate(group) for second in group[i + 1:]]
    by_function: dict[str, list[Entry]] = {}
    for entry in group:
        by_function.setdefault(called(entry), []).append(entry)
    out = []
    for pool in (group, *by_function.values()):
        for _ in range(rounds if len(pool) >= size else 0):
            order = rng.sample(pool, len(pool))
            out += [tuple(order[i:i + size]) for i in range(0, len(order) - size + 1, size)]
    return out


def _spread(tuples: list[tuple[Entry, ...]], uses: Counter[str], most: int = 4) -> list[tuple[Entry, ...]]:
    """The tuples in order, each kept while all its entries are in fewer than `most` kept tuples
    (a few large function groups would otherwise supply most of them); a tuple seen before
    (the same entries in any order) is not kept again."""
    kept, seen = [], set()
    for tuple_ in tuples:
        key = frozenset(e.id for e in tuple_)
        if key not in seen and all(uses[e.id] < most for e in tuple_):
            seen.add(key)
            uses.update(e.id for e in tuple_)
            kept.append(tuple_)
    return kept


def fewer_functions(entry: Entry, most: int) -> Entry:
    """`entry` offering at most `most` functions: every function its expected calls name, then
    others drawn at random (seeded by its id) until there are `most`, in the entry's own
    order. Only functions no expected call names go, so the answer stays right (an entry
    whose calls name more than `most` keeps those); one offering `most` or fewer is returned
    as it is."""
    if most < 1:
        raise ConfigError(f"field 'env.max_functions': {most} leaves no function to call; use 1 or more, or leave it unset")
    if len(entry.functions) <= most:
        return entry
    named = {name for call in entry.expected for name in call}
    kept = [i for i, function in enumerate(entry.functions) if function["name"] in named]
    others = [i for i in range(len(entry.functions)) if i not in kept]
    chosen = sorted(kept + random.Random(entry.id).sample(others, max(0, most - len(kept))))
    return replace(
        entry,
        functions=[entry.functions[i] for i in chosen],
        shown=[entry.shown[i] for i in chosen] if entry.shown is not None else None,
    )


UNANSWERABLE_CATEGORY = "unanswerable"

COMMON_NAME_WORDS = frozenset(
    "get set list add create update delete remove find search lookup check info details data api the for and with by of to".split()
)
"""Words of function names that say nothing of a domain: they never make two function lists related."""

OPEN_ENDED = re.compile(r"(execute|cmd|command|shell|default_function|requests?|http|query|eval)", re.IGNORECASE)
"""Function names that can serve almost any question (a shell, an HTTP client): never offered as unrelated."""


def name_words(entry: Entry) -> set[str]:
    """The domain words of an entry's function names: split at ".", "_" and lower-to-upper
    case changes, lower-cased, three letters or more, the common ones dropped."""
    words = set()
    for function in entry.functions:
        spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", function["name"])
        words |= {w for w in re.split(r"[^A-Za-z]+", spaced.lower()) if len(w) >= 3}
    return words - COMMON_NAME_WORDS


def unrelated(entry: Entry, other: Entry) -> bool:
    """Whether `other`'s functions plausibly cannot answer `entry`'s question: no domain word
    shared between the two function lists, none of `other`'s in the question, and no
    open-ended function (`OPEN_ENDED`) on `other`'s list."""
    if any(OPEN_ENDED.search(f["name"]) for f in other.functions):
        return False
    theirs = name_words(other)
    return not theirs & name_words(entry) and not theirs & set(question_key(entry).split())


def unanswerable(entry: Entry, other: Entry) -> Entry:
    """`entry`'s question offered `other`'s functions instead of its own: no call is right."""
    return Entry(
        id=f"unanswerable_{entry.id}+{other.id}",
        category=UNANSWERABLE_CATEGORY,
        messages=list(entry.messages),
        functions=other.functions,
        expected=[],
        language=other.language,
        shown=other.shown,
    )


def unanswerable_entries(train: tuple[Entry, ...] | list[Entry], n: int, seed: int = 0, tries: int = 50) -> list[Entry]:
    """`n` irrelevance entries made from train entries that expect one call (`composable`):
    each question once, offered the functions of another such entry that are `unrelated` to
    it (the first of up to `tries` random picks), so refraining is taught on the very
    questions the call entries ask. The same `n` and `seed` give the same entries."""
    if n <= 0:
        return []
    pool = sorted((e for e in train if composable(e)), key=lambda e: e.id)
    rng = random.Random(f"bfcl/unanswerable/{seed}")
    out = []
    for entry in rng.sample(pool, len(pool)):
        other = next((o for o in (rng.choice(pool) for _ in range(tries)) if unrelated(entry, o)), None)
        if other is not None:
            out.append(unanswerable(entry, other))
        if len(out) == n:
            return out
    raise ConfigError(
        f"field 'env.unanswerable': {n} entries asked, but only {len(out)} train questions found unrelated functions; ask for fewer"
    )


ENUMERATED_CATEGORIES = ("enumerated_parallel", "enumerated_parallel_multiple")


def as_words(value: str) -> re.Pattern[str]:
    """`value` as whole words, case aside ("2" is not in "2023")."""
    return re.compile(r"(?<!\w)" + re.escape(value) + r"(?!\w)", re.IGNORECASE)


def mentions(question: str, value: str) -> int:
    """How often `value` occurs in `question` as whole words (`as_words`)."""
    return len(as_words(value).findall(question))


def spoken(value: Any) -> str | None:
    """`value` as a question would say it, if it can stand in a list: a string of 2-40 characters
    holding no comma, " and " or line break, or an integer; else None (a float's text is rarely
    the question's, a boolean or an object is never said)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and 2 <= len(value) <= 40 and not re.search(r",|\n|\band\b", value, re.IGNORECASE):
        return value
    return None


def said_values(entry: Entry) -> list[tuple[str, str]]:
    """The (parameter, words) of a composable entry's call whose acceptable value the question says
    exactly once (`spoken`, `mentions`): the values a list of others can stand in for."""
    question = entry.messages[0].content
    (arguments,) = entry.expected[0].values()
    out = []
    for parameter, acceptable in arguments.items():
        words = next((w for w in map(spoken, acceptable) if w is not None and mentions(question, w) == 1), None)
        if words is not None:
            out.append((parameter, words))
    return out


def listed(words: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def enumerate_value(entry: Entry, parameter: str, said: str, others: list[tuple[Entry, str]], also: Entry | None = None) -> Entry:
    """`entry`'s question with the value it says for `parameter` replaced by a list of it and the
    values `others` say for the same parameter of the same function ("... in Paris?" -> "... in
    Paris, Rome and Oslo?"), expecting one call per value, the rest of the call as it was; with
    `also`, another entry of the same functions calling another function, its question after
    this one as one paragraph (`prose`) and its call expected too."""
    question = entry.messages[0].content
    at = as_words(said).search(question)
    assert at is not None  # said_values found it once
    start, end = at.span()
    quote = question[start - 1] if 0 < start and end < len(question) and question[start - 1] == question[end] in "'\"" else ""
    words = [question[start:end], *(w for _, w in others)]
    asked = question[: start - len(quote)] + listed([f"{quote}{w}{quote}" for w in words]) + question[end + len(quote):]
    (function, arguments), = entry.expected[0].items()
    calls = [entry.expected[0]]
    for other, other_said in others:
        acceptable = next(iter(other.expected[0].values()))[parameter]
        value = next(v for v in acceptable if spoken(v) == other_said)
        calls.append({function: {**arguments, parameter: [value, *(v for v in acceptable if v != value)]}})
    ids = "+".join([entry.id, *(o.id for o, _ in others)])
    if also is not None:
        ids += "+" + also.id
        asked = prose([asked, also.messages[0].content], random.Random(ids))
        calls.append(also.expected[0])
    return Entry(
        id=f"enumerated_{ids}:{parameter}",
        category=ENUMERATED_CATEGORIES[also is not None],
        messages=[Message("user", asked)],
        functions=entry.functions,
        expected=calls,
        language=entry.language,
        shown=entry.shown,
    )


def enumerated_entries(
    train: tuple[Entry, ...] | list[Entry], n: int, seed: int = 0, calls: tuple[int, ...] = (2, 3, 4), most: int = 2
) -> list[Entry]:
    """`n` enumerated entries (`enumerate_value`) of train entries, shared out evenly over the
    numbers of calls in `calls` (the first sizes take what does not divide). Each stands a value
    its question says (`said_values`) for a list of values other kept entries say for the same
    parameter of the same function (its definition identical), each said once in the new question;
    every second one, where the entry's function list has another function some kept entry
    calls, also asks that entry's question (`enumerated_parallel_multiple`, one call more).
    Each entry starts at most `most` entries of a size. The same `n`, `seed` and `calls` give the same entries."""
    if n <= 0:
        return []
    kept = sorted((e for e in train if composable(e)), key=lambda e: e.id)
    said: dict[tuple[str, str], list[tuple[Entry, str]]] = {}
    callers: dict[str, list[Entry]] = {}
    for entry in kept:
        callers.setdefault(function_list(entry), []).append(entry)
        for parameter, words in said_values(entry):
            said.setdefault((definition(entry), parameter), []).append((entry, words))
    candidates = [(entry, key, words) for key, pool in said.items() for entry, words in pool]
    shares = [n // len(calls) + (i < n % len(calls)) for i in range(len(calls))]
    out = []
    for size, share in zip(calls, shares):
        if size < 2:
            raise ConfigError(f"field 'env.enumerated_calls': {size} is not a number of calls to enumerate; use 2 or more")
        rng = random.Random(f"bfcl/enumerated/{seed}/{size}")
        made: list[Entry] = []
        uses: Counter[str] = Counter()
        for entry, (definition_key, parameter), words in rng.sample(candidates, len(candidates)):
            if len(made) == share:
                break
            question = entry.messages[0].content
            pool = said[(definition_key, parameter)]
            others = {w.lower(): (o, w) for o, w in pool if w.lower() != words.lower() and not mentions(question, w)}
            if uses[entry.id] >= most or len(others) < size - 1:
                continue
            chosen = rng.sample(sorted(others.values(), key=lambda pair: pair[1]), size - 1)
            partners = [e for e in callers[function_list(entry)] if called(e) != called(entry)]
            also = rng.choice(partners) if partners and len(made) % 2 else None
            enumerated = enumerate_value(entry, parameter, words, chosen, also)
            if all(mentions(enumerated.messages[0].content, w) == 1 for w in [words, *(w for _, w in chosen)]):
                made.append(enumerated)  # else one value holds another ("Drama", "Comedy-drama"): which call is which?
                uses[entry.id] += 1
        if len(made) < share:
            raise ConfigError(
                f"field 'env.enumerated': {share} entries of {size} calls asked, but the train split gives {len(made)}; "
                "ask for fewer, or spread them over more sizes (env.enumerated_calls)"
            )
        out += made
    return out


def definition(entry: Entry) -> str:
    """The definition of the function a composable entry calls, as a key: entries with the same one can share values."""
    name = called(entry)
    return json.dumps(next(f for f in entry.functions if f["name"] == name), sort_keys=True)


def _not_run(**arguments: Any) -> str:
    return NOT_RUN


def checked_schema(spec: ToolSpec) -> dict[str, Any]:
    """The schema a call is checked against: the shown one with no argument beyond its
    properties (BFCL fails a call with a parameter the function does not take) and no `enum`
    (BFCL's checker never reads one, and its own answers leave them: 9 train entries)."""
    parameters = without_enums(spec.parameters)
    return {**parameters, "additionalProperties": False} if "properties" in parameters else parameters


def without_enums(schema: Any) -> Any:
    """`schema` with every `enum` keyword removed, at any depth (a property named "enum" stays)."""
    if isinstance(schema, list):
        return [without_enums(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: value for key, value in schema.items() if key != "enum"}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {name: without_enums(sub) for name, sub in out["properties"].items()}
    for key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
        if key in out:
            out[key] = without_enums(out[key])
    return out


def entry_tools(entry: Entry) -> ToolSet:
    """An entry's functions as tools checked against its own schemas, returning NOT_RUN."""
    return ToolSet([schema_tool(spec, _not_run, "BFCL function", checked_schema(spec)) for spec in entry.specs()])


def gate_tools(entries: list[Entry]) -> ToolSet:
    """Every function the entries show, for the gate, which knows one schema per name: where
    entries show one name with different schemas, a call passes if it fits one of them
    (`anyOf`), and the episode's own tools (`entry_tools`) then hold it to its entry's."""
    variants: dict[str, dict[str, Any]] = {}
    first: dict[str, ToolSpec] = {}
    for entry in entries:
        for spec in entry.specs():
            first.setdefault(spec.name, spec)
            schema = checked_schema(spec)
            variants.setdefault(spec.name, {}).setdefault(repr(sorted(schema.items())), schema)
    tools = []
    for name, spec in first.items():
        schemas = list(variants[name].values())
        checked = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        tools.append(schema_tool(ToolSpec(name, spec.description, checked), _not_run, "BFCL function"))
    return ToolSet(tools)


@cache
def _gate_tools(categories: tuple[str, ...]) -> ToolSet:
    split = v4_split(archived=any(c in ARCHIVED_CATEGORIES for c in categories))
    return gate_tools([e for e in (*split.train, *split.held_out) if e.category in categories])


class BfclSession(Session):
    """One episode of one entry: its functions, and one assistant turn."""

    single_turn = True

    def __init__(self, tools: ToolSet) -> None:
        self.tools = tools


@dataclass(frozen=True)
class BfclOptions:
    """bfcl's options (env.OPTION in a config)."""

    categories: tuple[Category, ...] = CATEGORIES
    """The BFCL categories to draw entries from (default: all thirteen), BFCL's group names
    (`CATEGORY_GROUPS`: live, non_live) standing for theirs; the live ones make `train`, the
    others `eval`."""
    composed: int = 0
    """Composed entries added to `train` (`composed_entries`), from the kept ones."""
    composed_calls: tuple[int, ...] = (2,)
    """The numbers of calls the composed entries hold."""
    composed_style: str = "lines"
    """How they ask their questions: one a line (`lines`), or as one paragraph with "First,
    ... Then, ..." (`prose`, as the held-out parallel entries ask)."""
    unanswerable: int = 0
    """Irrelevance entries added to `train` (`unanswerable_entries`), from the kept ones."""
    enumerated: int = 0
    """Entries added to `train` that ask for one value of a kept entry as a list of several
    (`enumerated_entries`), one call each."""
    enumerated_calls: tuple[int, ...] = (2, 3, 4)
    """The numbers of calls the enumerated entries hold."""
    max_functions: int | None = None
    """Each `train` entry (composed and unanswerable ones included) offers at most this many
    functions, those it does not call dropped (`fewer_functions`); None offers all. The
    held-out entries offer 1 to 4; the live ones up to 37."""
    archived: bool = False
    """Add the archived entries (ARCHIVED_CATEGORIES: exec_simple, exec_multiple,
    exec_parallel, exec_parallel_multiple) to `train`, those sharing a question or a function
    name with a held-out entry dropped like live ones; composed, unanswerable and enumerated
    entries are then made of them too."""


class BfclEnv(Env):
    """BFCL v4's single-turn entries, one scored assistant turn each; see the module docstring."""

    name = "bfcl"
    system_prompt = ""
    """Unused: an entry's own messages are the prompt (some live entries bring a system message)."""
    single_turn = True
    success_reward = "bfcl_correct"
    default_rewards = {
        "bfcl_correct": 1.0,
        "bfcl_param_values": 0.2,
        "bfcl_tool_name": 0.1,
        "bfcl_param_names": 0.1,
        "bfcl_format": 0.1,
        "tool_call_count": 0.0,
        "invalid_call_count": 0.0,
    }

    def __init__(self, options: BfclOptions = BfclOptions()) -> None:
        self.categories = known_categories(options.categories)
        self.archived = options.archived
        self.sources = self.categories + (ARCHIVED_CATEGORIES if options.archived else ())
        """The categories of `train`'s entries before composed, unanswerable and enumerated ones are added."""
        split = v4_split(options.archived)
        train = [e for e in split.train if e.category in self.sources]
        added = (
            composed_entries(train, options.composed, calls=tuple(options.composed_calls), style=options.composed_style)
            + unanswerable_entries(train, options.unanswerable)
            + enumerated_entries(train, options.enumerated, calls=tuple(options.enumerated_calls))
        )
        limit = options.max_functions
        self.pools = {
            "train": [e if limit is None else fewer_functions(e, limit) for e in train + added],
            "eval": [e for e in split.held_out if e.category in self.categories],
        }
        self.dropped = {i: why for i, why in split.dropped.items() if train_category(i) in self.sources}
        """Live (and archived) entries of these categories left out of `train`, and what each shares with the held-out split."""
        self.entries = {e.id: e for pool in self.pools.values() for e in pool}
        self._entry_tools: dict[str, ToolSet] = {}
        """`entry_tools` per entry id, built when an episode first needs them (a group shares them)."""

    @cached_property
    def tools(self) -> ToolSet:
        """Every function of these categories, for the gate (`gate_tools`): built on first use,
        once per process for the same categories (its schemas take seconds to check)."""
        return _gate_tools(self.sources)

    def tasks(self, split: str, n: int, seed: int) -> list[Task]:
        """`n` entries of `split`, shuffled by `seed`; past the split's size it starts a new shuffle."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}: use 'train' or 'eval' ('test')")
        pool = sorted(e.id for e in self.pools[SPLITS[split]])
        if not pool:
            raise ValueError(f"no {split} entries among categories {list(self.categories)}: train is the live ones, eval the others")
        return [self.task(entry_id) for entry_id in cycled_draw(pool, n, f"bfcl/{SPLITS[split]}/{seed}")]

    def task(self, entry_id: str) -> Task:
        """The task of one entry, by its BFCL id."""
        return entry_task(self.entries[entry_id])

    def task_specs(self, task: Task) -> list[ToolSpec]:
        """The entry's functions, as BFCL shows them."""
        return self.entries[task.id].specs()

    def initial_messages(self, task: Task) -> list[Message]:
        return list(self.entries[task.id].messages)

    def session(self, task: Task) -> BfclSession:
        if task.id not in self._entry_tools:
            self._entry_tools[task.id] = entry_tools(self.entries[task.id])
        return BfclSession(self._entry_tools[task.id])
