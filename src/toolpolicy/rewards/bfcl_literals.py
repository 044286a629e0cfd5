"""Java and JavaScript argument values as BFCL reads and writes them.

BFCL's Java and JavaScript entries show every parameter to the model as a
string holding a source literal (`"5L"`, `"new int[]{1, 2}"`, `"[1, 2]"`,
`"{key: 'v'}"`), and its AST checker turns that string into a Python value
before comparing it with the possible answers. `read_java` and `read_js` apply
the same reading, rule for rule, including where it departs from the languages:

- a literal that does not have the type's exact form stays the string it was
  (`"5"` for a Java long, `"1e3"` for a JavaScript float);
- collections are cut at every comma and at the first closing bracket, so an
  element holding a comma or a nested collection is cut too;
- in a Java array (`new T[]{...}`) each element is read as the item type, and a
  String element keeps its quotes: `new String[]{"a"}` is `['"a"']`, which no
  answer "a" matches, while `new String[]{a}` is `["a"]`. An `ArrayList` drops
  the first and last character of each String or char element instead;
- a Java `char` is never converted (the value stays as written); a Java String
  or any-typed value is taken as written, quotes and all;
- a JavaScript object's values have their quotes stripped before they are read,
  so `{n: "12"}` holds the number 12.

`java_literal` and `js_literal` write a Python value back as the literal that
reads as it, which is what a model that knows the answer sends.

>>> read_java("new ArrayList<Integer>(Arrays.asList(1, 2))", "ArrayList", "integer")
[1, 2]
>>> read_js("{a: 1, b: 'x'}", "dict")
{'a': 1, 'b': 'x'}
>>> read_java(java_literal(5, "long"), "long")
5
"""

from __future__ import annotations

import re
from typing import Any

JAVA_TYPES: dict[str, type] = {
    "byte": int, "short": int, "integer": int, "long": int, "float": float, "double": float, "boolean": bool,
    "char": str, "String": str, "any": str, "Array": list, "ArrayList": list, "Queue": list, "Stack": list,
    "HashMap": dict, "Hashtable": dict, "Set": set,
}
"""The Python type each Java type is read as."""
JS_TYPES: dict[str, type] = {
    "String": str, "integer": int, "float": float, "Bigint": int, "Boolean": bool, "dict": dict, "array": list, "any": str,
}
"""The Python type each JavaScript type is read as."""

_INT = re.compile(r"-?\d+")
_JAVA_FLOAT = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]")
_JAVA_DOUBLE = re.compile(r"-?\d+(\.\d+)?([eE][+-]?\d+)?")
_JAVA_LONG = re.compile(r"-?\d+[lL]")
_JS_FLOAT = re.compile(r"-?\d+(\.\d+)?")
_JS_BIGINT = re.compile(r"-?\d+n")
_JAVA_ARRAY = re.compile(r"new\s+\w+\[\]\s*\{(.*?)\}")
_JAVA_AS_LIST = re.compile(r"new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)")
_JAVA_ADDS = re.compile(r"new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}", re.DOTALL)
_JAVA_ADD = re.compile(r"add\((.+?)\)")
_JAVA_EMPTY_LIST = re.compile(r"new\s+ArrayList<\w*>\(\)")
_JAVA_MAP = re.compile(r"new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}", re.DOTALL)
_JAVA_PUT = re.compile(r"put\(\"(.*?)\",\s*(.*?)\)")
_JAVA_EMPTY_MAP = re.compile(r"new\s+HashMap<.*?>\s*\(\)")
_JS_GRID = re.compile(r"\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\)")
_JS_ROW = re.compile(r"\[(.*?)\]")
_JS_LIST = re.compile(r"\[(.*?)\]|\bnew\s+Array\((.*?)\)")
_JS_OBJECT = re.compile(r"\{(.*?)\}")
_JS_PAIR = re.compile(r"([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)")


class UnreadableType(ValueError):
    """A declared type BFCL has no reading for (Set, Queue, ...): its checker stops on it too."""


def read_java(text: str, kind: str, item_kind: str | None = None) -> Any:
    """The value BFCL's checker reads from the Java literal `text` of type `kind`."""
    if kind in ("byte", "short", "integer"):
        return int(text) if _INT.fullmatch(text) else text
    if kind == "float":
        return float(text[:-1]) if _JAVA_FLOAT.fullmatch(text) else text
    if kind == "double":
        return float(text) if _JAVA_DOUBLE.fullmatch(text) else text
    if kind == "long":
        return int(text[:-1]) if _JAVA_LONG.fullmatch(text) else text
    if kind == "boolean":
        return text == "true" if text in ("true", "false") else text
    if kind in ("char", "String", "any"):
        return text
    if kind == "Array":
        return _java_array(text, item_kind)
    if kind == "ArrayList":
        return _java_array_list(text, item_kind)
    if kind == "HashMap":
        return _java_map(text)
    raise UnreadableType(f"BFCL does not read Java {kind} values")


def _java_item(text: str, item_kind: str | None) -> Any:
    return read_java(text, item_kind) if item_kind else read_java_untyped(text)


def _java_array(text: str, item_kind: str | None) -> Any:
    found = _JAVA_ARRAY.search(text)
    if not found:
        return text
    return [_java_item(part.strip(), item_kind) for part in found.group(1).split(",") if part.strip()]


def _java_array_list(text: str, item_kind: str | None) -> Any:
    found = _JAVA_AS_LIST.search(text)
    parts = [p.strip() for p in found.group(1).split(",")] if found else None
    if parts is None and (found := _JAVA_ADDS.search(text)):
        parts = [p.strip() for p in _JAVA_ADD.findall(found.group(1))]
    if parts is None:
        return [] if _JAVA_EMPTY_LIST.search(text) else text
    if item_kind in ("char", "String"):
        return [p[1:-1] for p in parts]  # the quotes, or whatever the first and last characters are
    return [_java_item(p, item_kind) for p in parts]


def _java_map(text: str) -> Any:
    found = _JAVA_MAP.search(text)
    if found:
        return {key: read_java_untyped(value.strip()) for key, value in _JAVA_PUT.findall(found.group(1))}
    return {} if _JAVA_EMPTY_MAP.search(text) else text


def read_java_untyped(text: str) -> Any:
    """A Java literal of no declared type: boolean, quoted string, long, float, then int, double or the text."""
    if text in ("true", "false"):
        return text == "true"
    if len(text) >= 1 and text[0] == text[-1] == '"':
        return text[1:-1]
    if _JAVA_LONG.fullmatch(text):
        return int(text[:-1])
    if _JAVA_FLOAT.fullmatch(text):
        return float(text[:-1])
    return _number_or_text(text)


def _number_or_text(text: str) -> Any:
    """Python's own int(), then float(), else the text: BFCL reads untyped numbers this way."""
    for number in (int, float):
        try:
            return number(text)
        except ValueError:
            pass
    return text


def read_js(text: str, kind: str, item_kind: str | None = None) -> Any:
    """The value BFCL's checker reads from the JavaScript literal `text` of type `kind`."""
    if kind == "String":
        return text[1:-1] if len(text) >= 1 and text[0] == text[-1] and text[0] in "\"'" else text
    if kind == "integer":
        return int(text) if _INT.fullmatch(text) else text
    if kind == "float":
        return float(text) if _JS_FLOAT.fullmatch(text) else text
    if kind == "Bigint":
        return int(text[:-1]) if _JS_BIGINT.fullmatch(text) else text
    if kind == "Boolean":
        return text == "true" if text in ("true", "false") else text
    if kind == "any":
        return text
    if kind == "array":
        return _js_array(text.strip(), item_kind)
    if kind == "dict":
        return _js_object(text.strip())
    raise UnreadableType(f"BFCL does not read JavaScript {kind} values")


def _js_array(text: str, item_kind: str | None) -> Any:
    if grid := _JS_GRID.match(text):
        rows = _JS_ROW.findall(grid.group(0))
        rows[0] = rows[0].strip().removeprefix("[")  # the outer bracket opens the first row's match
        return [[read_js_untyped(p.strip()) for p in row.strip().split(",")] for row in rows]
    found = _JS_LIST.match(text)
    if not found:
        return text
    inner = found.group(1) if found.group(1) is not None else found.group(2)
    parts = [p.strip() for p in inner.strip().split(",")] if inner and inner.strip() else []
    if not item_kind:
        return [read_js_untyped(p) for p in parts]
    try:
        return [read_js(p, item_kind) for p in parts]
    except UnreadableType:
        return text


def _js_object(text: str) -> Any:
    if text == "{}":
        return {}
    found = _JS_OBJECT.match(text)
    if not found:
        return text
    out: dict[str, Any] = {}
    for key, value in _JS_PAIR.findall(found.group(1)):
        key, value = key.strip().strip("'\""), value.strip()
        if value.startswith("[") and value.endswith("]"):
            out[key] = _js_array(value, None)
        elif value.startswith("{") and value.endswith("}"):
            out[key] = _js_object(value)
        else:
            out[key] = read_js_untyped(value.strip("'\""))
    return out


def read_js_untyped(text: str) -> Any:
    """A JavaScript literal of no declared type: boolean, quoted string, then int, float or the text."""
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if len(text) >= 1 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return _number_or_text(text)


def _plain_number(value: float) -> str:
    """A float without an exponent, the only form BFCL's number patterns accept."""
    text = repr(float(value))
    return text if "e" not in text and "inf" not in text and "nan" not in text else f"{value:.20f}".rstrip("0").rstrip(".")


def java_literal(value: Any, kind: str, item_kind: str | None = None) -> str:
    """The Java literal that BFCL reads as `value` for a parameter of type `kind`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind == "long" and isinstance(value, int):
        return f"{value}L"
    if kind == "float" and isinstance(value, (int, float)):
        return f"{_plain_number(value)}f"
    if kind == "double" and isinstance(value, (int, float)):
        return _plain_number(value)
    if kind == "Array" and isinstance(value, list):
        return "new Object[]{" + ", ".join(java_literal(item, item_kind or "any") for item in value) + "}"
    if kind == "ArrayList" and isinstance(value, list):
        quote = '"' if item_kind in ("char", "String") else ""
        items = [quote + java_literal(item, item_kind or "any") + quote for item in value]
        return "new ArrayList<>(Arrays.asList(" + ", ".join(items) + "))" if items else "new ArrayList<>()"
    if kind == "HashMap" and isinstance(value, dict):
        puts = "".join(f'put("{key}", {_java_untyped_literal(item)}); ' for key, item in value.items())
        return "new HashMap<String, Object>() {{ " + puts + "}}"
    return str(value)


def _java_untyped_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _plain_number(value)
    if isinstance(value, int):
        return str(value)
    return f'"{value}"'


def js_literal(value: Any, kind: str, item_kind: str | None = None) -> str:
    """The JavaScript literal that BFCL reads as `value` for a parameter of type `kind`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if kind in ("String", "untyped") and isinstance(value, str):
        return f'"{value}"'  # read back by dropping the first and last character, so nothing is escaped
    if kind == "float" and isinstance(value, (int, float)):
        return _plain_number(value)
    if kind == "Bigint" and isinstance(value, int):
        return f"{value}n"
    if kind == "array" and isinstance(value, list):
        return "[" + ", ".join(js_literal(item, item_kind or "untyped") for item in value) + "]"
    if kind == "dict" and isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {js_literal(item, 'untyped')}" for key, item in value.items()) + "}"
    if kind == "untyped" and isinstance(value, list):
        return js_literal(value, "array")
    if kind == "untyped" and isinstance(value, float):
        return _plain_number(value)
    return str(value)
