"""The trace's vocabulary and its JSON reading, below every other trace module.

    SCHEMA, RECORD_LEVELS, the verdict names (ACCEPTED, REJECTED, NOT_REACHED), MASK, the limits
    TraceError                      a trace that cannot be read, said in one line
    parse_json, check_schema        text -> JSON data, size and nesting bounded before parsing
    read_as(cls, d, where)          a dataclass from a JSON object, every field read by its declared
                                    type (int, float, str, bool, X | None, list, tuple, dict, Any,
                                    a dataclass): what Trace.from_dict and the typed records use

speclab.trace holds the trace's dataclasses, its checks and replay; speclab.records the typed
records a method adds to a round or a step. Both read with this module, and nothing here imports
either, so no lazy import points back up.
"""
from __future__ import annotations

import functools
import json
import math
import re
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Callable

SCHEMA = "speclab.trace/2"
SCHEMA_NAME, SCHEMA_VERSION = SCHEMA.split("/")[0], int(SCHEMA.split("/")[1])
RECORD_LEVELS = (None, "light", "full")
# what a trace file may be, checked before the JSON is parsed: a 128-token run recorded "full" is
# well under 1 MB, and no trace nests deeper than about 8 levels (params may hold lists of lists)
MAX_TRACE_BYTES = 512 * 2**20
MAX_JSON_DEPTH = 64

# decisions a draft node can get
ACCEPTED, REJECTED, NOT_REACHED = "accepted", "rejected", "not_reached"
MASK = -1                               # an Edit's token when the position is (or becomes) masked


class TraceError(ValueError):
    """A trace file that cannot be read: corrupted, wrong schema, or from a newer speclab."""



# what a denoising step's threshold is compared with: a position's top-1 probability (Fast-dLLM,
# LocalLeap), the factor of Fast-dLLM's rank-dependent bound, or a top-1 / top-2 logit gap
# (Prophet, SchED). Figures draw a threshold line on the confidence axis for "probability" only.
THRESHOLD_SCALES = ("probability", "factor", "logit-gap")


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r'[^\[\]{}]+')


def json_depth(text: str) -> int:
    """How deeply the JSON text nests ([ and { outside strings), found without parsing it, so a
    hostile file cannot exhaust the parser's recursion."""
    import numpy as np
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)).encode("ascii")
    if not brackets:
        return 0
    b = np.frombuffer(brackets, dtype=np.uint8)
    steps = np.where((b == ord("[")) | (b == ord("{")), 1, -1)
    return int(np.cumsum(steps).max())


def parse_json(data: str | bytes, name: str = "the trace", limit: int = MAX_TRACE_BYTES) -> Any:
    """JSON text or bytes -> Python data, or TraceError: over `limit` bytes, nested deeper than
    MAX_JSON_DEPTH, not UTF-8 or not JSON. Size and depth are checked before parsing."""
    if len(data) > limit:
        raise TraceError(f"{name} is {len(data) / 2**20:.1f} MB, more than a trace may be ({limit / 2**20:.0f} MB)")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise TraceError(f"{name} is not a speclab trace (not UTF-8 text: {e})") from e
    depth = json_depth(data)
    if depth > MAX_JSON_DEPTH:
        raise TraceError(f"{name} is not a speclab trace: its JSON nests {depth} levels deep "
                         f"(a trace never goes past {MAX_JSON_DEPTH})")
    try:
        return json.loads(data)
    except (json.JSONDecodeError, RecursionError) as e:
        raise TraceError(f"{name} is not a speclab trace (not valid JSON: {e})") from e


def check_schema(d: Any) -> None:
    if not isinstance(d, dict) or "schema" not in d:
        raise TraceError("not a speclab trace: no 'schema' field")
    name, _, version = str(d["schema"]).partition("/")
    if name != SCHEMA_NAME or not re.fullmatch(r"[1-9][0-9]{0,5}", version):     # versions count from 1
        raise TraceError(f"unknown trace schema {d['schema']!r}; expected {SCHEMA!r}")
    if int(version) > SCHEMA_VERSION:
        raise TraceError(f"trace schema {d['schema']!r} is newer than this speclab ({SCHEMA}); "
                         "upgrade speclab (pip install -U speclab) to open it")


# -- reading: every field of a trace file checked before replay or a view reads it ---------------
# A trace file is user input (an upload, `speclab export FILE`, Trace.load): each field must have
# the type its dataclass declares, numbers must be finite and exact in a double (plotly.js reads
# every number as one), and whatever points somewhere must point inside the trace (a node's parent,
# a canvas position, a DAG vertex), so that replay and the views never index out of range, size a
# list by a number nobody recorded, or walk a cycle. Fields a reader does not know are ignored.
EMITTED_KINDS = ("bonus", "correction", "target", "accepted")   # "accepted": PEARL's post-verify round
DECISIONS = (ACCEPTED, REJECTED, NOT_REACHED)
MAX_NUMBER = 2**53              # the largest integer a double (JSON in a browser) holds exactly
MAX_TOKEN_ID = 2**31 - 1        # a vocabulary id fits int32, what torch and numpy index with
# views draw one cell per canvas slot or DAG vertex at every step, and a bar per draft depth: sizes
# far past any real run (a dLLM canvas of a thousand slots, a draft of a few hundred tokens) are
# refused rather than drawn for minutes
MAX_CANVAS = 2**13
MAX_DRAFT = 2**14


def _bad(where: str, what: str) -> TraceError:
    return TraceError(f"corrupted trace: {where} {what}; re-record it with `speclab run --trace`")


def _kind(v: Any) -> str:
    """A value for a message: short, one line."""
    text = json.dumps(v, default=repr) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


_HINTS: dict[type, list] = {}


def _fields(cls) -> list:
    """(field, type) of a dataclass, its string annotations resolved once."""
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = [(f, hints[f.name]) for f in fields(cls)]
    return _HINTS[cls]


def _build(cls, d: Any, where: str):
    """A `cls` from a JSON object, each field converted by its declared type (_reader)."""
    if not isinstance(d, dict):
        raise _bad(where, f"is {_kind(d)}, not an object")
    kw = {}
    for f, hint in _fields(cls):
        if f.name in d:
            kw[f.name] = _reader(hint)(d[f.name], f.name if where == "the trace" else f"{where}.{f.name}")
        elif f.default is MISSING and f.default_factory is MISSING:
            raise _bad(where, f"has no {f.name!r} field")
    return cls(**kw)


@functools.cache
def _reader(hint) -> Callable[[Any, str], Any]:
    """read(value, where) for a field's type: int, float, str, bool, X | None, list[X], tuple[X, ...],
    dict[str | int, X], Any (plain JSON) or a dataclass; made once per type."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return _plain
    if origin in (typing.Union, types.UnionType):
        (arm,) = [a for a in args if a is not type(None)]
        some = _reader(arm)
        return lambda v, where: None if v is None else some(v, where)
    if hint in (int, float, str, bool):
        return {int: _int, float: _float, str: _str, bool: _bool}[hint]
    if origin is list:                  # a tuple too: Trace.to_dict() keeps them, JSON makes them lists
        item, ok = _reader(args[0]), _as_is(args[0])

        def read_list(v, where):
            if not isinstance(v, (list, tuple)):
                raise _bad(where, f"is {_kind(v)}, not a list")
            if ok is not None and all(map(ok, v)):    # ids, probabilities, top-k rows: the bulk of a file
                return list(v)
            return [item(x, f"{where}[{i}]") for i, x in enumerate(v)]
        return read_list
    if origin is tuple:
        items = [_reader(a) for a in args]

        def read_tuple(v, where):
            if not isinstance(v, (list, tuple)) or len(v) != len(items):
                raise _bad(where, f"is {_kind(v)}, not a list of {len(items)}")
            return tuple(read(x, f"{where}[{i}]") for i, (read, x) in enumerate(zip(items, v)))
        return read_tuple
    if origin is dict:
        value = _reader(args[1])

        def read_dict(v, where):
            if not isinstance(v, dict):
                raise _bad(where, f"is {_kind(v)}, not an object")
            return {_key(args[0], k, where): value(x, f"{where}[{k!r}]") for k, x in v.items()}
        return read_dict
    if is_dataclass(hint):
        return lambda v, where: _build(hint, v, where)
    raise TypeError(f"no reader for the type {hint!r}")       # a new field's type: add it above


def _as_is(hint) -> Callable[[Any], bool] | None:
    """A test that a value already is what _reader(hint) would return (ints, floats and lists of
    them): the fast path, with no message built. None for other types."""
    if hint is int:
        return lambda x: type(x) is int and -MAX_NUMBER <= x <= MAX_NUMBER
    if hint is float:
        return lambda x: type(x) is float and math.isfinite(x) or type(x) is int and -MAX_NUMBER <= x <= MAX_NUMBER
    if typing.get_origin(hint) is list and (ok := _as_is(typing.get_args(hint)[0])) is not None:
        return lambda x: type(x) is list and all(map(ok, x))
    return None


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise _bad(where, f"is {_kind(v)}, not true or false")
    return v


def _key(hint, k: Any, where: str):
    """A JSON object's key as the dict's key type: str, or int (token_text's ids)."""
    if not isinstance(k, str):
        raise _bad(where, f"has the key {_kind(k)}, not a string")
    if hint is int:
        try:
            return _int(int(k), f"{where} key {k!r}")
        except ValueError:
            raise _bad(where, f"has the key {k!r}, not a token id") from None
    return _str(k, f"{where} key")


def _int(v: Any, where: str) -> int:
    if isinstance(v, float) and v.is_integer():         # 3.0 from a tool that writes every number as a float
        v = int(v)
    if type(v) is not int:
        raise _bad(where, f"is {_kind(v)}, not an integer")
    if abs(v) > MAX_NUMBER:
        raise _bad(where, f"is {v}, more than any trace holds")
    return v


def _float(v: Any, where: str) -> float:
    if type(v) is int:                  # kept an int: a top-k row's token id is one
        return _int(v, where)
    if not isinstance(v, float):
        raise _bad(where, f"is {_kind(v)}, not a number")
    if not math.isfinite(v):
        raise _bad(where, f"is {v}, not a finite number")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise _bad(where, f"is {_kind(v)}, not a string")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:              # a lone surrogate ("\\ud800"): no page or file can hold it
        raise _bad(where, f"holds {_kind(v)}, which is not valid text") from None
    return v


def _plain(v: Any, where: str) -> Any:
    """A free-form value (params, info, a decision's inputs and output): JSON's own types only,
    its text valid; views show it as it is."""
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        return _str(v, where)
    if isinstance(v, (list, tuple)):
        return [_plain(x, f"{where}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, dict):
        return {_str(k, f"{where} key"): _plain(x, f"{where}[{k!r}]") for k, x in v.items()}
    raise _bad(where, f"is a {type(v).__name__}, not a JSON value")


def read_as(cls, d: Any, where: str):
    """A `cls` (a dataclass) from a JSON object, each field read by its declared type; TraceError
    names the first field that is not what it declares."""
    return _build(cls, d, where)
