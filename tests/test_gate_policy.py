"""Loading policies: every mistake is refused at load with the file, the rule id and the
problem; nothing but PolicyError ever escapes, whatever the YAML holds."""

from __future__ import annotations

import contextlib
import textwrap
from pathlib import Path

import cel
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolpolicy.gate import Gate, Policy, PolicyError, PolicyWarning
from toolpolicy.gate.policy import CEL_FUNCTIONS, MAX_CONDITION_CHARS, clip
from toolpolicy.gate.values import VALUE_FUNCTIONS
from toolpolicy.types import ToolCall, ToolSpec

WORKSPACE = Path(__file__).resolve().parents[1] / "examples" / "policies" / "workspace.yaml"

GOOD = """
default: deny
rules:
  - id: read-work
    effect: permit
    tools: [read_file]
    when: args.path.startsWith('/work/')
  - id: no-dotdot
    effect: forbid
    tools: "*"
    when: "has(args.path) && args.path.contains('..')"
    reason: no traversal
    hint: stay in /work
limits:
  max_calls: {read_file: 3, "*": 10}
  max_consecutive_errors: {"*": 2}
redact: ['sk-[A-Za-z0-9]{10,}']
"""


def load(text: str) -> Policy:
    return Policy.from_yaml(textwrap.dedent(text), source="test.yaml")


def problems_of(text: str) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load(text)
    assert caught.value.source == "test.yaml"
    assert str(caught.value).startswith("test.yaml:")
    return caught.value.problems


def one_rule(**fields: object) -> str:
    rule = {"id": "r1", "effect": "forbid", "tools": ["t"], "reason": "because", **fields}
    return yaml.safe_dump({"rules": [{k: v for k, v in rule.items() if v is not None}]})


def test_a_good_policy_loads_with_its_rules_limits_and_patterns() -> None:
    policy = load(GOOD)
    assert [r.id for r in policy.rules] == ["read-work", "no-dotdot"]
    assert policy.rules[1].tools is None and policy.rules[1].hint == "stay in /work"
    assert policy.limits.max_calls == {"read_file": 3, "*": 10}
    assert policy.redact("token sk-abcdefghijklmn!") == "token [REDACTED]!"
    assert policy.tool_names() == {"read_file"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (one_rule(effect="forbidd"), "rule 'r1': effect 'forbidd' must be one of permit, forbid, ask"),
        (one_rule(colour="red"), "rule 'r1': unknown key 'colour'"),
        (one_rule(when="args.path.startsWith("), "rule 'r1': when does not compile as CEL"),
        (one_rule(when="argz.path == 'x'"), "rule 'r1': when reads unknown variable(s) argz"),
        (one_rule(when="args.p.lowerAscii() == 'x'"), "rule 'r1': when calls unknown function(s) lowerAscii"),
        (one_rule(when=True), "rule 'r1': when must be a CEL expression string, not a boolean"),
        (one_rule(when=" "), "rule 'r1': when is empty"),
        (one_rule(when="true || " * 600 + "true"), f"the limit is {MAX_CONDITION_CHARS}"),
        (one_rule(reason=""), "rule 'r1': a forbid rule needs a 'reason'"),
        (one_rule(tools=None), "rule 'r1': missing 'tools'"),
        (one_rule(tools=[]), "rule 'r1': tools must be a non-empty list"),
        (one_rule(tools=["a", "*"]), "rule 'r1': write tools: \"*\" on its own"),
        (one_rule(tools=[3]), "rule 'r1': tool names must be non-empty strings"),
        (one_rule(id="has:colon"), "id 'has:colon' must be 1-64 letters"),
        (one_rule(id=None), "rules[0]: missing 'id'"),
        (yaml.safe_dump({"rules": [{"id": "a", "effect": "permit", "tools": "*"}] * 2}), "rule 'a': duplicate id"),
        ("default: maybe", "default must be 'allow' or 'deny', not 'maybe'"),
        ("rulez: []", "unknown top-level key 'rulez'"),
        ("rules: {id: a}", "rules must be a list of rules, not a mapping"),
        ("rules: [just-a-string]", "rules[0]: a rule must be a mapping"),
        ("limits: {max_calls: {t: -1}}", "limits.max_calls.t: -1 must be a whole number >= 0"),
        ("limits: {max_calls: {t: true}}", "limits.max_calls.t: True must be a whole number >= 0"),
        ("limits: {max_retries: {t: 1}}", "limits: unknown key 'max_retries'"),
        ("redact: ['(unclosed']", "redact[0]: '(unclosed' is not a pattern RE2 can run"),
        ("redact: ['secret(?=:)']", "redact[0]: 'secret(?=:)' is not a pattern RE2 can run (the engine that matches in linear time): invalid perl operator: (?="),
        ("redact: ['(a)\\1']", "is not a pattern RE2 can run"),
        ("redact: ['token\\Z']", "is not a pattern RE2 can run"),
        ("redact: ['a++b']", "is not a pattern RE2 can run"),
        ("redact: ['(?>ab)c']", "is not a pattern RE2 can run"),
        ("redact: ['x{1001}']", "invalid repetition size"),
        (one_rule(when="args.to.matches('^(?!admin)')"), "rule 'r1': when pattern '^(?!admin)' cannot run on CEL's regex engine"),
        (one_rule(when="matches(args.to, r'(a)\\1')"), "backreferences are not supported"),
        (one_rule(when="args.to.matches('a{5000}{5000}')"), "exceeds size limit"),
        ("redact: ['a*']", "redact[0]: 'a*' matches the empty string"),
        ("- a list", "a policy must be a mapping"),
        ("default: [unclosed", "not valid YAML"),
        ("rules:\n  - id: a\n    id: b\n    effect: permit\n    tools: '*'", "duplicate key 'id'"),
    ],
)
def test_each_load_error_names_the_rule_and_the_problem(text: str, expected: str) -> None:
    problems = problems_of(text)
    assert any(expected in problem for problem in problems), problems


def test_all_problems_are_reported_at_once() -> None:
    text = yaml.safe_dump(
        {
            "default": "nope",
            "rules": [
                {"id": "a", "effect": "permit", "tools": "*", "when": "args.x >"},
                {"id": "b", "effect": "forbid", "tools": "*", "when": "true"},
            ],
        }
    )
    problems = problems_of(text)
    assert len(problems) == 3, problems
    assert any("rule 'a'" in p for p in problems) and any("rule 'b'" in p and "reason" in p for p in problems)


def test_long_messages_are_cut_between_words() -> None:
    assert clip("short enough", 12) == "short enough"
    assert clip("expecting {STRING, BYTES, IDENTIFIER}", 30) == "expecting {STRING, BYTES, ..."  # 29 characters
    assert clip("x" * 50, 20) == "x" * 16 + " ..."  # one long word: cut where the limit falls
    when = "args.path.startsWith('/tmp') && (args.size > 10 || args.name == '" + "x" * 22 + "' ||"
    with pytest.raises(PolicyError) as error:
        Policy.from_dict({"rules": [{"id": "r", "effect": "permit", "tools": "*", "when": when}]})
    detail = str(error.value).split("when does not compile as CEL: ", 1)[1]
    with pytest.raises(ValueError) as compiled:
        cel.compile(when)
    whole = " ".join(str(compiled.value).split())  # the binding's message, longer than 300 characters
    assert len(detail) <= 300 and detail.endswith(" ...")
    kept = detail.removesuffix(" ...")
    assert whole.startswith(kept + " "), (kept, whole)  # cut at a space, not inside a word


def test_load_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(one_rule(effect="nope"))
    with pytest.raises(PolicyError, match=r"broken\.yaml: rule 'r1': effect"):
        Policy.load(path)
    with pytest.raises(PolicyError, match="cannot read"):
        Policy.load(tmp_path / "missing.yaml")


def test_the_hash_ignores_formatting_but_not_content() -> None:
    policy = load(GOOD)
    reformatted = yaml.safe_dump(yaml.safe_load(GOOD), default_flow_style=True)
    assert load(reformatted).hash == policy.hash
    assert load(GOOD.replace("max_calls: {read_file: 3", "max_calls: {read_file: 4")).hash != policy.hash
    assert len(policy.hash) == 64


def test_rules_are_indexed_by_tool() -> None:
    rules = [{"id": f"r{i}", "effect": "permit", "tools": [f"tool{i}"]} for i in range(200)]
    rules.append({"id": "everywhere", "effect": "forbid", "tools": "*", "reason": "x"})
    policy = Policy.from_dict({"rules": rules})
    found = policy.rules_for("tool7")
    assert [r.id for r in found.permit] == ["r7"] and [r.id for r in found.forbid] == ["everywhere"]
    assert policy.rules_for("tool7") is found  # computed once
    assert [r.id for r in policy.rules_for("other").permit] == []


def test_gate_refuses_a_policy_naming_a_tool_it_does_not_have() -> None:
    spec = ToolSpec("read_file", "read", {"type": "object", "properties": {"path": {"type": "string"}}})
    with pytest.raises(PolicyError, match="rule 'read-work': names unknown tool 'read_fil'"):
        Gate(load(GOOD.replace("[read_file]", "[read_fil]").replace("read_file: 3", "read_fil: 3")), [spec])
    Gate(load(GOOD), [spec])  # the real name is fine


@pytest.mark.parametrize("when", ["when:", "when: ~", "when: null", "when: ''", "when: '   '"])
def test_a_blank_when_is_a_load_error_naming_the_rule(when: str) -> None:
    """A condition that was meant and lost must not become "always": YAML's blank value
    (null) is refused like the empty string. Only a rule without `when` always applies."""
    text = f"rules:\n  - id: open-door\n    effect: permit\n    tools: [t]\n    {when}\n"
    problems = problems_of(text)
    assert len(problems) == 1 and problems[0].startswith("rule 'open-door': when is"), problems
    assert "remove 'when' for a rule that always applies" in problems[0]
    unconditional = load("rules:\n  - id: always\n    effect: permit\n    tools: [t]\n")
    assert unconditional.rules[0].when is None and unconditional.rules[0].program is None


CALCULATOR = ToolSpec(
    "calculator", "calc", {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}
)
SHELL = ToolSpec("run_shell", "shell", {"type": "object", "properties": {"command": {"type": "string"}}})
OPEN = ToolSpec("anything", "open schema", {"type": "object", "properties": {}, "additionalProperties": True})


@pytest.mark.parametrize(
    ("tools", "when", "expected"),
    [
        ("[calculator]", "args.expresion != ''", "rule 'r': when reads args.expresion, which calculator does not have"),
        ("[calculator]", "args['expresion'] == '1'", "reads args.expresion"),
        ("[calculator]", "has(args.expr) && args.expr == '1'", "reads args.expr"),
        ("[calculator, run_shell]", "args.command == 'ls'", "reads args.command, which calculator does not have"),
        ("'*'", "args.nothing == 1", "rule 'r': when reads args.nothing, which no tool has"),
    ],
)
def test_a_condition_reading_an_argument_the_tool_lacks_is_refused_when_the_gate_is_built(
    tools: str, when: str, expected: str
) -> None:
    """Such a condition loads, then fails on every call (a forbid denying all of them, a
    permit never matching); with the tools' schemas known it is refused, naming the rule,
    whether or not unknown tool names are tolerated."""
    policy = load(f"rules:\n  - id: r\n    effect: forbid\n    tools: {tools}\n    when: \"{when}\"\n    reason: x\n")
    for strict in (True, False):
        with pytest.raises(PolicyError) as caught:
            Gate(policy, [CALCULATOR, SHELL], strict_tool_names=strict)
        assert any(expected in problem for problem in caught.value.problems), caught.value.problems


def test_arguments_a_tool_has_or_might_have_are_accepted() -> None:
    for tools, when in (
        ("[calculator]", "args.expression.size() > 0 && args.exists(k, k == 'x') && 'args.typo' != ''"),
        ("'*'", "tool == 'run_shell' && size(args.command) > 10"),  # one tool has it
        ("[anything]", "args.whatever == 1"),  # an open schema may have any argument
    ):
        policy = load(f"rules:\n  - id: r\n    effect: forbid\n    tools: {tools}\n    when: \"{when}\"\n    reason: x\n")
        Gate(policy, [CALCULATOR, SHELL, OPEN])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("parse: {t: {path: path}}", "parse needs a work_folder"),
        ("work_folder: relative/dir", "work_folder must be an absolute folder path"),
        ("work_folder: /w/../x", "work_folder must be an absolute folder path"),
        ("work_folder: /w\nparse: {t: {path: glob}}", "parse.t.path: kind 'glob' must be one of path, command"),
        ("work_folder: /w\nparse: {t: [path]}", "parse.t must map argument names to a kind"),
        (
            "work_folder: /w\nparse: {t: {path: path}}\nrules: [{id: r, effect: permit, tools: [t], when: parsed.file.inside}]",
            "rule 'r': when reads parsed.file, but parse gives no 'file' for t",
        ),
        (
            "work_folder: /w\nrules: [{id: r, effect: permit, tools: '*', when: parsed.path.inside}]",
            "rule 'r': when reads parsed.path, which no tool has in parse",
        ),
    ],
)
def test_parse_tables_are_checked_at_load(text: str, expected: str) -> None:
    problems = problems_of(text)
    assert any(expected in problem for problem in problems), problems


def test_parsing_an_argument_the_tool_lacks_is_refused_when_the_gate_is_built() -> None:
    policy = load("work_folder: /w\nparse: {calculator: {expr: path}, run_shell: {command: command}}\n")
    with pytest.raises(PolicyError, match="parse.calculator.expr: calculator has no string argument 'expr'"):
        Gate(policy, [CALCULATOR, SHELL])
    with pytest.raises(PolicyError, match="parse: names unknown tool 'ghost'"):
        Gate(load("work_folder: /w\nparse: {ghost: {path: path}}\n"), [CALCULATOR])


def test_the_shipped_example_policy_loads() -> None:
    policy = Policy.load(WORKSPACE)
    assert len(policy.rules) >= 15 and policy.default == "deny"


# ---------------------------------------------------------------- fuzzing

KEYS = [
    "default",
    "rules",
    "limits",
    "redact",
    "id",
    "effect",
    "tools",
    "when",
    "reason",
    "hint",
    "max_calls",
    "max_consecutive_errors",
    "*",
    "x",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**20),
    st.floats(allow_nan=True),
    st.sampled_from(
        [
            "allow",
            "deny",
            "permit",
            "forbid",
            "ask",
            "*",
            "true",
            "args.x == 1",
            "args.",
            "(",
            "a*",
            "[",
            "history.exists(h, h.outcome == 'denied')",
            "x" * 5000,
            "\x00",
            "\ud800",
        ]
    ),
    st.text(max_size=30),
)
STRUCTURES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=5)), children, max_size=5),
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(STRUCTURES)
def test_random_structures_load_or_raise_policy_error(data: object) -> None:
    with contextlib.suppress(PolicyError):
        Policy.from_dict(data, "fuzz")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("abcdeflorsuwy:-[]{}*&!|>'\"\n #%@`?,.()\\0123456789")), max_size=200))
def test_random_yaml_text_loads_or_raises_policy_error(text: str) -> None:
    with contextlib.suppress(PolicyError):
        Policy.from_yaml(text, "fuzz")


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_example_policy_loads_or_raises_policy_error(data: st.DataObject) -> None:
    text = WORKSPACE.read_text()
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        span = data.draw(st.integers(0, 20))
        insert = data.draw(st.text(alphabet="abc:- '\"\n[]{}()|&*\\!.", max_size=5))
        text = text[:at] + insert + text[at + span :]
    with contextlib.suppress(PolicyError):
        Policy.from_yaml(text, "fuzz")


def test_yaml_bombs_and_odd_constructs_are_policy_errors() -> None:
    bomb = "a: &a [x, x]\nb: &b [*a, *a]\nc: &c [*b, *b]\nd: &d [*c, *c]\nrules: [*d, *d]"
    for text in [
        bomb,
        "!!python/object:os.system ls",
        "default: !!binary aGVsbG8=",
        "? [a, b]\n: c",
        "when: 2020-13-45",
        "[" * 5000,
        "{" * 5000,
    ]:
        with pytest.raises(PolicyError):
            Policy.from_yaml(text, "odd")


def test_every_allowed_cel_function_exists_in_the_installed_cel() -> None:
    """The load-time function allowlist must not promise what the CEL binding lacks."""
    ts = "timestamp('2024-03-04T05:06:07.891Z')"
    samples = {
        "size": "size('ab') == 2", "contains": "'ab'.contains('b')", "startsWith": "'ab'.startsWith('a')",
        "endsWith": "'ab'.endsWith('b')", "matches": "'ab'.matches('^a')", "int": "int('1') == 1",
        "uint": "uint(1) == 1u", "double": "double(1) == 1.0", "string": "string(1) == '1'",
        "bytes": "bytes('a') == b'a'", "timestamp": f"{ts} > timestamp('2000-01-01T00:00:00Z')",
        "duration": "duration('1s') > duration('0s')", "type": "type(1) == int", "dyn": "dyn(1) == 1",
    }  # fmt: skip
    samples |= {name: f"{ts}.{name}() >= 0" for name in CEL_FUNCTIONS if name.startswith("get")}
    assert set(samples) == set(CEL_FUNCTIONS) - set(VALUE_FUNCTIONS)
    for name, source in samples.items():
        policy = Policy.from_dict({"rules": [{"id": "r", "effect": "permit", "tools": "*", "when": source}]})
        assert policy.rules[0].program.execute({}) is True, name


def test_every_whole_value_function_is_callable_in_a_condition_both_ways() -> None:
    """toolpolicy's own functions (gate/values.py) are registered with every decision's context."""
    samples = {
        "emails": "emails('Mail A@B.com.') == ['a@b.com']", "urls": "urls('at www.b.com/x/.') == ['www.b.com/x']",
        "hosts": "hosts('see b.com') == ['b.com']", "sites": "sites('see www.b.co.uk') == ['b.co.uk']",
        "ibans": "ibans('GB29 NWBK 6016 1331 9268 19') == ['GB29NWBK60161331926819']",
        "numbers": "numbers('1 000') == ['1000']", "quoted": "quoted(\"say 'X'\") == ['X']", "normalized": "normalized(' A ') == 'a'",
        "mentions": "'pay b@c.com'.mentions('b@c.com') && !mentions('pay b@c.com', 'b@c.co')",
        "reveals": "'p a s s'.reveals('pass') && !reveals(['nothing'], 'pass')",
    }  # fmt: skip
    assert set(samples) == set(VALUE_FUNCTIONS)
    for name, source in samples.items():
        policy = Policy.from_dict({"default": "deny", "rules": [{"id": "r", "effect": "permit", "tools": "*", "when": source}]})
        assert Gate(policy, [SHELL]).decide(ToolCall("run_shell", {"command": "ls"})).allowed, name


def test_a_substring_test_on_an_argument_warns_and_names_the_whole_value_function() -> None:
    text = """
default: deny
rules:
  - {id: pay, effect: permit, tools: [pay], when: "state.request.contains(args.to)"}
  - {id: leak, effect: forbid, tools: [pay], when: "state.private.exists(p, args.memo.contains(p))", reason: no.}
  - {id: whole, effect: permit, tools: [pay], when: "mentions(state.request, args.to) && !reveals(args, 'x')"}
"""
    with pytest.warns(PolicyWarning) as caught:
        policy = Policy.from_yaml(text, source="pay.yaml")
    assert len(policy.warnings) == 2 == len(caught)
    assert "rule 'pay': `contains(args.to)` is a substring test" in policy.warnings[0]
    assert "use `mentions(text, args.to)`" in policy.warnings[0]
    assert "rule 'leak': `args.memo.contains(...)`" in policy.warnings[1] and "`reveals(args.memo, value)`" in policy.warnings[1]
    assert str(caught[0].message).startswith("pay.yaml: rule 'pay'")


def test_the_whole_value_functions_by_hand() -> None:
    import doctest

    import toolpolicy.gate.values

    result = doctest.testmod(toolpolicy.gate.values)
    assert result.attempted >= 12 and result.failed == 0


SECRET_SAMPLES = {
    "private key block": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
    "AWS access key id": "ASIAABCDEFGHIJKLMNOP",
    "GitHub token": "gho_" + "a1B2" * 9,
    "OpenAI or Anthropic style key": "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
    "Slack token": "xoxp-1234567890-abcdef",
    "Google API key": "AIza" + "Sy0_-abcdefghijklmnopqrstuvwxyzABCD",
    "Stripe secret key": "rk_live_0123456789abcdefXYZ",
    "bearer token": "Authorization: BeArEr eyJhbGciOiJIUzI1NiJ9.abc",
}


def test_every_built_in_secret_format_is_redacted_through_its_anchor() -> None:
    """The quick check (DEFAULT_REDACT_ANCHORS) must never hide a match of the patterns:
    one sample of each format, alone and inside other text, gives what the regex alone gives."""
    import random

    from toolpolicy.gate.policy import _DEFAULT_REDACT, DEFAULT_REDACT

    assert set(SECRET_SAMPLES) == {what for what, _ in DEFAULT_REDACT}  # a new format needs a sample here
    policy = Policy.from_yaml("default: allow")
    rng = random.Random(0)
    words = ["log", "line", "key=", "x", "\n", " ", "-", "_", "BEGIN", "ak", "sk", "token:", "ghp", "é"]
    for what, sample in SECRET_SAMPLES.items():
        assert "[REDACTED]" in policy.redact(f"text {sample} text") and sample not in policy.redact(f"text {sample} text"), what
        for _ in range(50):
            text = "".join(rng.choice(words) for _ in range(rng.randrange(12))) + sample + rng.choice(words)
            assert policy.redact(text) == _DEFAULT_REDACT.sub("[REDACTED]", text), text


def test_redaction_patterns_run_on_a_linear_time_engine() -> None:
    """A policy's `redact` patterns are compiled by RE2, never by the backtracking `re`: a
    pattern that backtracks exponentially there, `(a+)+$`, is an ordinary one here."""
    import re2

    policy = load("redact: ['(x+x+)+y', '(?i)password\\s*=\\s*\\S+']\n")
    assert all(isinstance(pattern, type(re2.compile("a"))) for pattern in policy.redact_patterns)
    assert policy.redact("x" * 5000 + "y and PASSWORD = hunter2") == "[REDACTED] and [REDACTED]"
    assert policy.redact("x" * 5000) == "x" * 5000


def test_a_pattern_in_a_session_tally_is_checked_like_one_in_a_rule() -> None:
    problems = problems_of("session: {t: {tools: [t], when: \"args.x.matches('(?<=a)b')\"}}\n")
    assert any(p.startswith("session.t: when pattern '(?<=a)b' cannot run on CEL's regex engine") for p in problems)
