"""The machinery of typed records (speclab/records.py declares the records themselves): the `Record`
base, the `@record(level)` decorator that registers a record type and the info keys it owns, the
load-time check of a round's or step's `info`, the readers (`parts`, `holds`, `column`,
`undeclared`) and the docs table (`schema_table`). speclab.records re-exports every name here."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from speclab.scoped import scoped
from speclab.trace_schema import TraceError, read_as

LEVELS = ("round", "step")          # a speculative round (Round.info), a denoising step (DenoiseStep.info)
STRICT_ENV = "SPECLAB_STRICT_RECORDS"   # "1": a trace with an undeclared info key is refused when built

# level -> record name -> class; level -> info key -> the class that owns it
RECORDS: dict[str, dict[str, type]] = {lv: {} for lv in LEVELS}
OWNER: dict[str, dict[str, type]] = {lv: {} for lv in LEVELS}


class Record:
    """Base of the record types: every field is an info key, optional (None: not recorded)."""
    name: ClassVar[str] = ""        # how views and docs name it: "skip mask"
    level: ClassVar[str] = ""       # "round" | "step"

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, part) -> "Record | None":
        """This record of a round or step (anything with `.info`), or None where it holds none of
        its keys. Values are as loaded (a loaded trace's types were checked)."""
        info = part.info
        if not any(k in info for k in cls.keys()):
            return None
        return cls(**{k: info[k] for k in cls.keys() if k in info})

    def info(self) -> dict[str, Any]:
        """The record as info keys, unrecorded (None) fields left out: what a drafter writes."""
        return {k: getattr(self, k) for k in self.keys() if getattr(self, k) is not None}


def record(level: str, name: str | None = None):
    """Class decorator: a frozen dataclass record of `level` ("round" or "step"), registered."""
    def wrap(cls):
        cls = dataclass(frozen=True)(cls)
        cls.level = level
        cls.name = name or _words(cls.__name__)
        return register_record(cls)
    return wrap


def _words(camel: str) -> str:
    out = "".join(" " + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(camel))
    return out.replace("  ", " ")


def register_record(cls: type) -> type:
    """Declare a record type: its keys may then appear in its level's `info` (a user's method, a
    test's). ValueError for an unknown level, a second record of the name, or a key another owns."""
    if cls.level not in LEVELS:
        raise ValueError(f"record {cls.__name__}: level must be one of {LEVELS}, got {cls.level!r}")
    for f in fields(cls):
        if f.default is not None:
            raise ValueError(f"record {cls.__name__}: field {f.name!r} must default to None (not recorded)")
    taken = {k: OWNER[cls.level][k].__name__ for k in cls.keys()
             if k in OWNER[cls.level] and OWNER[cls.level][k] is not cls}
    if taken:
        raise ValueError(f"record {cls.__name__}: {', '.join(f'{k!r} belongs to {o}' for k, o in taken.items())} "
                         "already; use that record or another key")
    if RECORDS[cls.level].get(cls.name, cls) is not cls:
        raise ValueError(f"a {cls.level} record named {cls.name!r} is already declared: remove_record it first")
    RECORDS[cls.level][cls.name] = cls
    for k in cls.keys():
        OWNER[cls.level][k] = cls
    return cls


def remove_record(cls: type) -> None:
    RECORDS[cls.level].pop(cls.name, None)
    for k in cls.keys():
        if OWNER[cls.level].get(k) is cls:
            del OWNER[cls.level][k]


def registered_record(cls: type):
    """register_record for the length of a `with` block (a test's record)."""
    return scoped(register_record, remove_record, cls, cls)


def owner(level: str, key: str) -> type | None:
    return OWNER[level].get(key)


def check_info(info: dict, level: str, where: str) -> None:
    """Each declared key of one `info` object has its record's type (TraceError names the first
    that does not); undeclared keys pass, unless SPECLAB_STRICT_RECORDS=1 (what the suite sets)."""
    mine: dict[type, dict] = {}
    for k, v in info.items():
        cls = OWNER[level].get(k)
        if cls is None:
            if os.environ.get(STRICT_ENV) == "1":
                raise TraceError(f"{where}.info[{k!r}] is declared by no record type: declare it "
                                 f"(speclab.records.record) beside the method that writes it")
            continue
        mine.setdefault(cls, {})[k] = v
    for cls, d in mine.items():
        read_as(cls, d, f"{where}.info")


def undeclared(trace) -> set[str]:
    """The info keys of a trace's rounds and steps that no record type declares."""
    out = {k for r in trace.rounds for k in r.info if k not in OWNER["round"]}
    return out | {k for s in trace.denoise for k in s.info if k not in OWNER["step"]}


def parts(trace, level: str) -> list:
    return trace.rounds if level == "round" else trace.denoise


def holds(trace, cls: type) -> bool:
    """Some round or step of the trace recorded this record."""
    return any(cls.of(p) is not None for p in parts(trace, cls.level))


def column(trace, cls: type, key: str) -> list:
    """One value of `key` a round or step (None where not recorded)."""
    return [p.info.get(key) for p in parts(trace, cls.level)]


def schema_table() -> str:
    """Every declared record as a Markdown table: level, record, keys and types, what it says."""
    import typing
    rows = ["| level | record | keys (JSON type) | what it records |", "|---|---|---|---|"]
    for level in LEVELS:
        for name, cls in sorted(RECORDS[level].items()):
            hints = typing.get_type_hints(cls)
            keys = ", ".join(f"`{k}` ({_type_words(hints[k])})" for k in cls.keys())
            doc = " ".join((cls.__doc__ or "").split())
            rows.append(f"| {level} | {name} | {keys} | {doc} |")
    return "\n".join(rows)


def _type_words(hint) -> str:
    import types
    import typing
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    if hint is Any:
        return "any"
    origin = typing.get_origin(hint)
    if origin is list:
        inner = typing.get_args(hint)
        return f"list of {_type_words(inner[0])}" if inner else "list"
    if origin is dict or hint is dict:
        return "object"
    return {int: "integer", float: "number", str: "string", bool: "true/false", list: "list"}.get(hint, str(hint))


# every record name, for the docs test and `speclab` help
def names() -> list[str]:
    return [f"{level}: {name}" for level in LEVELS for name in sorted(RECORDS[level])]

