"""Regular expressions for structured outputs a token automaton can hold (aserve.sampling.fsm).

:func:`schema_regex` writes a JSON schema of a regular subset as a regex in outlines-core's
syntax (Rust's ``regex-syntax``), :func:`spec_regex` a choice or such a schema; anything outside
the subset is None and stays with llguidance. The language lies inside the schema's: objects
take their properties in the schema's order, all required, none other
(``additionalProperties: false`` is asked for); JSON is laid out as llguidance is told to lay
it out here (``", "`` and ``": "``, no other whitespace); strings, integers and their escapes
are llguidance's own (each automaton's masks are compared with llguidance's as it is built).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from aserve.sampling_params import StructuredOutputs

# The longest bounded string written as an automaton.
MAX_STRING = 64

_META = set("\\.+*?()|[]{}^$#&-~")
# A JSON string's character as llguidance allows it (its masks and the automaton's are compared
# state by state as the automaton is built): control characters and DEL only escaped, "\u"
# escapes only for those, no escaped "/".
_JSON_CHAR = r'([^"\\\x00-\x1f\x7f]|\\(["\\bfnrt]|u00[01][0-9a-fA-F]|u007[fF]))'
_JSON_STRING = f'"{_JSON_CHAR}*"'
_JSON_NUMBER = r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?"
_JSON_INTEGER = r"-?(0|[1-9][0-9]*)"


def escape(text: str) -> str:
    """``text`` as a literal in outlines-core's regex syntax (Rust's ``regex-syntax``)."""
    return "".join("\\" + c if c in _META else c for c in text)


def _either(literals: Iterable[str]) -> str:
    """An alternation of regex-escaped literals, the longest first: outlines-core's automaton
    may stop where an earlier alternative has matched the whole regex (``(1|12)`` alone never
    reaches "12", ``(12|1)`` does). Where it still stops short of the grammar (a top-level
    ``a(bc)?``, a top-level number), the build's comparison with llguidance refuses it."""
    return "(" + "|".join(sorted(literals, key=len, reverse=True)) + ")"


def int_range_regex(lo: int, hi: int) -> str:
    """A regex matching exactly the decimal integers from ``lo`` to ``hi`` as JSON writes them
    (no leading zeros, ``-`` for negatives), and ``-0`` where ``lo < 0 <= hi`` (llguidance
    allows it there, and JSON reads it as 0)."""
    assert lo <= hi
    alts = []
    if lo < 0:
        alts.append("-" + _nonneg(0 if hi >= 0 else -hi, -lo))
    if hi >= 0:
        alts.append(_nonneg(max(lo, 0), hi))
    return "(" + "|".join(alts) + ")"


def _nonneg(lo: int, hi: int) -> str:
    """Integers ``lo`` to ``hi`` (both >= 0), by their number of digits."""
    alts = []
    for n in range(len(str(hi)), len(str(lo)) - 1, -1):  # longest first: see _either
        a, b = max(lo, 10 ** (n - 1) if n > 1 else 0), min(hi, 10**n - 1)
        if a <= b:
            alts.append(_same_length(str(a), str(b)))
    return "(" + "|".join(alts) + ")"


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of one length from ``lo`` to ``hi`` (inclusive)."""
    if not lo:
        return ""
    if lo[0] == hi[0]:
        return lo[0] + _same_length(lo[1:], hi[1:])
    rest = len(lo) - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        return f"[{lo[0]}-{hi[0]}]" + "[0-9]" * rest
    alts = [lo[0] + _same_length(lo[1:], "9" * rest)]
    if int(hi[0]) - int(lo[0]) > 1:
        alts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]" + "[0-9]" * rest)
    alts.append(hi[0] + _same_length("0" * rest, hi[1:]))
    return "(" + "|".join(alts) + ")"


def schema_regex(schema: Any) -> str | None:
    """The regex of ``schema``'s JSON texts in this module's subset, or None outside it."""
    if not isinstance(schema, dict):
        return None
    keys = set(schema) - {"title", "description", "$schema"}
    if "enum" in schema or "const" in schema:
        values = schema["enum"] if "enum" in schema else [schema["const"]]
        if keys - {"enum", "const", "type"} or not isinstance(values, list) or not values:
            return None
        if any(isinstance(v, dict | list) for v in values):
            return None
        return _either(escape(json.dumps(v, ensure_ascii=False)) for v in values)
    kind = schema.get("type")
    if kind == "integer":
        return _integer(schema, keys - {"type"})
    if kind == "boolean" and keys == {"type"}:
        return "(true|false)"
    if kind == "null" and keys == {"type"}:
        return "null"
    if kind == "string" and keys == {"type"}:
        return _JSON_STRING
    if kind == "string" and keys - {"type"} <= {"minLength", "maxLength"}:
        return _bounded_string(schema.get("minLength", 0), schema.get("maxLength"))
    if kind == "number" and keys == {"type"}:
        return _JSON_NUMBER
    if kind == "array":
        return _array(schema, keys - {"type"})
    if kind == "object":
        return _object(schema, keys - {"type"})
    return None


def _bounded_string(least: Any, most: Any) -> str | None:
    """A string of ``least`` to ``most`` characters (at most :data:`MAX_STRING`: each is a
    state whose moves span the vocabulary)."""
    if not isinstance(least, int) or not isinstance(most, int) or not 0 <= least <= most <= MAX_STRING:
        return None
    return f'"{_JSON_CHAR}{{{least},{most}}}"'


def _integer(schema: dict[str, Any], keys: set[str]) -> str | None:
    if not keys:
        return _JSON_INTEGER
    if keys != {"minimum", "maximum"}:
        return None
    lo, hi = schema["minimum"], schema["maximum"]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi)) or lo > hi:
        return None
    return int_range_regex(lo, hi)


def _array(schema: dict[str, Any], keys: set[str]) -> str | None:
    if keys - {"items", "minItems", "maxItems"} or "items" not in schema:
        return None
    item = schema_regex(schema["items"])
    least, most = schema.get("minItems", 0), schema.get("maxItems")
    if item is None or not isinstance(least, int) or not (most is None or isinstance(most, int)):
        return None
    if most is not None and most < least:
        return None
    if most == 0:
        return r"\[\]"
    upper = "" if most is None else str(most - 1)
    if least == 0:
        return rf"\[({item}(, {item}){{0,{upper}}})?\]"
    return rf"\[{item}(, {item}){{{least - 1},{upper}}}\]"


def _object(schema: dict[str, Any], keys: set[str]) -> str | None:
    props = schema.get("properties", {})
    if keys - {"properties", "required", "additionalProperties"} or schema.get("additionalProperties") is not False:
        return None
    if not isinstance(props, dict) or sorted(schema.get("required", [])) != sorted(props):
        return None
    fields = []
    for name, sub in props.items():
        value = schema_regex(sub)
        if value is None:
            return None
        fields.append(escape(json.dumps(name, ensure_ascii=False)) + ": " + value)
    return r"\{" + ", ".join(fields) + r"\}"


def spec_regex(spec: StructuredOutputs) -> str | None:
    """The regex of a spec this module can compile (a choice, a JSON schema in the subset)."""
    if spec.choice is not None:
        return _either(escape(c) for c in spec.choice)
    if spec.json is not None:
        try:
            return schema_regex(json.loads(str(spec.json)) if isinstance(spec.json, str) else spec.json)
        except ValueError:
            return None
    return None
