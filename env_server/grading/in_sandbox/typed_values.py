"""A strict, typed encoding of plain Python values, for grading by call table.

Standard library only: the same file runs inside the grading sandbox (the call harness decodes
the arguments and encodes what the solution returned) and on the host (tasks encode arguments
and expected results; the grader compares). An encoded value is JSON: `[tag, payload]`.

Only values whose type is *exactly* None, bool, int, float, str, bytes, list, tuple, dict, set
or frozenset encode, recursively. A subclass (an `int` whose `__eq__` lies), any other object,
a NaN, or a value nested deeper than `MAX_DEPTH` encodes as `UNENCODABLE`, which equals nothing,
so the comparison never runs code the solution wrote.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64
"""Deeper nesting is unencodable (and keeps encoding and comparing clear of the recursion limit)."""

UNENCODABLE: list[Any] = ["unencodable"]
"""What a value outside the strict types encodes to; never equal to anything, itself included."""

_SEQUENCES = {list: "list", tuple: "tuple"}
_SETS = {set: "set", frozenset: "frozenset"}
_SCALARS = {bool: "bool", int: "int", str: "str"}


class Unencodable(ValueError):
    """A value (or an encoded value) outside the strict types."""


def encode(value: Any) -> list[Any]:
    """The typed encoding of `value`, or `UNENCODABLE`."""
    try:
        return _encode(value, 0)
    except (Unencodable, RecursionError):
        return list(UNENCODABLE)


def encode_strict(value: Any) -> list[Any]:
    """The typed encoding of `value`; raises `Unencodable` (for task authors' values)."""
    return _encode(value, 0)


def _encode(value: Any, depth: int) -> list[Any]:
    if depth > MAX_DEPTH:
        raise Unencodable("nested too deep")
    kind = type(value)
    if value is None:
        return ["none", None]
    if kind in _SCALARS:
        return [_SCALARS[kind], value]
    if kind is float:
        if math.isnan(value):
            raise Unencodable("NaN equals nothing")
        return ["float", repr(value)]
    if kind is bytes:
        return ["bytes", value.hex()]
    if kind in _SEQUENCES:
        return [_SEQUENCES[kind], [_encode(item, depth + 1) for item in value]]
    if kind in _SETS:
        # Sorted by canonical text, so equal sets encode identically whatever their iteration order.
        return [_SETS[kind], sorted((_encode(item, depth + 1) for item in value), key=canonical)]
    if kind is dict:
        return ["dict", [[_encode(key, depth + 1), _encode(item, depth + 1)] for key, item in value.items()]]
    raise Unencodable(f"type {kind.__qualname__} is not a plain value")


def canonical(encoded: list[Any]) -> str:
    """A stable text of an encoded value (hashable; equal values give equal text)."""
    return json.dumps(encoded, separators=(",", ":"), sort_keys=True)


def decode(encoded: Any) -> Any:
    """The Python value of a well-formed encoding; raises `Unencodable` otherwise."""
    return _decode(encoded, 0)


def _decode(encoded: Any, depth: int) -> Any:
    if depth > MAX_DEPTH or type(encoded) is not list or len(encoded) != 2 or type(encoded[0]) is not str:
        raise Unencodable(f"not an encoded value: {str(encoded)[:80]}")
    tag, payload = encoded
    if tag == "none" and payload is None:
        return None
    for kind, name in _SCALARS.items():
        if tag == name and type(payload) is kind:
            return payload
    if tag == "float" and type(payload) is str:
        number = float(payload)
        if math.isnan(number):
            raise Unencodable("NaN equals nothing")
        return number
    if tag == "bytes" and type(payload) is str:
        return bytes.fromhex(payload)
    if type(payload) is list:
        if tag in ("list", "tuple"):
            items = [_decode(item, depth + 1) for item in payload]
            return items if tag == "list" else tuple(items)
        if tag in ("set", "frozenset"):
            items = [_decode(item, depth + 1) for item in payload]
            return set(items) if tag == "set" else frozenset(items)
        if tag == "dict" and all(type(pair) is list and len(pair) == 2 for pair in payload):
            return {_decode(key, depth + 1): _decode(item, depth + 1) for key, item in payload}
    raise Unencodable(f"not an encoded value: {str(encoded)[:80]}")


def matches(actual: Any, expected: list[Any], *, rel_tol: float, abs_tol: float) -> bool:
    """Whether the encoded `actual` equals the encoded `expected`: same types everywhere, same
    values, floats within the tolerances (`math.isclose`), set elements and dict keys exactly.

    `actual` may be anything (it comes from the sandbox); a malformed one matches nothing."""
    try:
        decode(actual)
    except (Unencodable, ValueError, TypeError, RecursionError):
        return False
    return _matches(actual, expected, rel_tol, abs_tol)


def _matches(actual: list[Any], expected: list[Any], rel_tol: float, abs_tol: float) -> bool:
    tag, payload = expected
    if actual[0] != tag:
        return False
    if tag == "float":
        wanted, got = float(payload), float(actual[1])
        if math.isinf(wanted) or math.isinf(got):
            return wanted == got
        return math.isclose(got, wanted, rel_tol=rel_tol, abs_tol=abs_tol)
    if tag in ("list", "tuple"):
        return len(actual[1]) == len(payload) and all(
            _matches(got, wanted, rel_tol, abs_tol) for got, wanted in zip(actual[1], payload)
        )
    if tag in ("set", "frozenset"):
        return sorted(map(canonical, actual[1])) == sorted(map(canonical, payload))
    if tag == "dict":
        got_items = {canonical(key): item for key, item in actual[1]}
        wanted_items = {canonical(key): item for key, item in payload}
        return (
            len(got_items) == len(actual[1])
            and got_items.keys() == wanted_items.keys()
            and all(_matches(got_items[key], wanted, rel_tol, abs_tol) for key, wanted in wanted_items.items())
        )
    return actual == expected
