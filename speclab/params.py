"""NAME=VALUE method parameters as people type them: `--param schedule=heuristic` (CLI), the
dashboard's "other parameters" box, the bench's `draft-model[k=6;threshold=0.4]`. One parser for
all three, below each of them.
"""
from __future__ import annotations

import json
import math
import numbers
import types
import typing
from typing import Any


def parse_value(s: str) -> Any:
    """int, float, none / true / false, a JSON list ("[[0], [0, 0]]"), or the string itself. A number
    must be finite ("nan", "inf", "1e999" are refused): parameters are recorded in the trace, whose
    JSON other tools read, and no method has a use for one."""
    s = s.strip()
    for cast in (int, float):
        try:
            v = cast(s)
        except ValueError:
            continue
        if not math.isfinite(v):
            raise ValueError(f"value {s!r} is not a finite number")
        return v
    if s.startswith("["):
        try:
            v = json.loads(s, parse_constant=_no_constant)      # a JSON list: it starts with [
        except ValueError as e:                                 # JSONDecodeError, or NaN / Infinity
            raise ValueError(f"bad list value {s!r}: {e}") from e
        if not all(math.isfinite(x) for x in _numbers(v)):
            raise ValueError(f"bad list value {s!r}: its numbers must be finite")
        return v
    return {"none": None, "true": True, "false": False}.get(s.lower(), s)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a finite number")


def _numbers(v: Any):
    """Every float or int in a parsed JSON value (json.loads turns 1e999 into inf)."""
    if isinstance(v, list):
        for x in v:
            yield from _numbers(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from _numbers(x)
    elif isinstance(v, float):
        yield v


def parse_assignment(item: str, example: str = "schedule=heuristic") -> tuple[str, Any]:
    """"name=value" -> (name with '-' as '_', parsed value); ValueError naming the expected form."""
    if "=" not in item:
        raise ValueError(f"parameter {item.strip()!r} needs the form name=value, e.g. {example}")
    name, value = item.split("=", 1)
    name = name.strip().replace("-", "_")
    if not name:
        raise ValueError(f"parameter {item.strip()!r} has no name: use name=value, e.g. {example}")
    return name, parse_value(value)


# -- a parsed value against the type its method declares -------------------------------------------
# `--param k=abc` parses to the string "abc"; a drafter or policy comparing it with a number fails
# with a TypeError deep in its code, so each value is checked first against the annotation of the
# constructor or config field it goes to: a number (int or float: whether it must be whole, and its
# range, are the method's own checks, whose messages say what the number means), bool, str, a class
# (a SuffixHistory), or none of them. The rest (a list of token ids, no annotation) is left to the
# method.
TYPE_WORDS = {int: "a number", float: "a number", bool: "true or false", str: "a string"}


def check_types(owner: str, params: dict, hints: dict) -> None:
    """ValueError naming the first parameter whose value its declared type (in `hints`) refuses."""
    for name, v in params.items():
        hint = hints.get(name)
        if hint is not None and _fits(hint, v) is False:
            arms = _arms(hint)
            want = " or ".join(dict.fromkeys(_word(t) for t in arms if t is not type(None)))
            want += " (or none)" if type(None) in arms else ""
            raise ValueError(f"{owner}: {name} must be {want}, got {_short(v)}")


def _arms(hint) -> tuple:
    return typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)


def _word(t) -> str:
    return TYPE_WORDS.get(t) or f"a {getattr(t, '__name__', t)}"


def _fits(hint, v) -> bool | None:
    """Whether `v` has the declared type; None where the annotation is one this does not read."""
    verdicts = [v is None if t is type(None) else _is(t, v) for t in _arms(hint)]
    if True in verdicts:
        return True
    return None if None in verdicts else False


def _is(t, v) -> bool | None:
    if t in (int, float):                   # numpy's numbers too: they are numbers.Real
        return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)
    if t in (bool, str):
        return isinstance(v, t)
    if isinstance(t, type) and typing.get_origin(t) is None:     # a class, not list[int]
        return isinstance(v, t)
    return None


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."
