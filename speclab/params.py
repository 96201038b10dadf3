"""NAME=VALUE method parameters as people type them: `--param schedule=heuristic` (CLI), the
dashboard's "other parameters" box, the bench's `draft-model[k=6;threshold=0.4]`. One parser for
all three, below each of them.
"""
from __future__ import annotations

import json
from typing import Any


def parse_value(s: str) -> Any:
    """int, float, none / true / false, a JSON list ("[[0], [0, 0]]"), or the string itself."""
    s = s.strip()
    for cast in (int, float):
        try:
            return cast(s)
        except ValueError:
            pass
    if s.startswith("["):
        try:
            return json.loads(s)
        except json.JSONDecodeError as e:
            raise ValueError(f"bad list value {s!r}: {e}") from e
    return {"none": None, "true": True, "false": False}.get(s.lower(), s)


def parse_assignment(item: str, example: str = "schedule=heuristic") -> tuple[str, Any]:
    """"name=value" -> (name with '-' as '_', parsed value); ValueError naming the expected form."""
    if "=" not in item:
        raise ValueError(f"parameter {item.strip()!r} needs the form name=value, e.g. {example}")
    name, value = item.split("=", 1)
    name = name.strip().replace("-", "_")
    if not name:
        raise ValueError(f"parameter {item.strip()!r} has no name: use name=value, e.g. {example}")
    return name, parse_value(value)
