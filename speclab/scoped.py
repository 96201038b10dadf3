"""`scoped(add, remove, row, key)`: a row in a registry for the length of a `with` block, and
`lookup(table, name, ...)`: a row by name, or one line that lists the names there are.

Every registry of the package (methods, engines and their steps, acceptance rules, views) offers
`registered_x(row)` for tests and notebooks; each is `scoped`, so a block that raises still removes
its row. No imports of the package: any layer may use it.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable


@contextlib.contextmanager
def scoped(add: Callable[[Any], Any], remove: Callable[[Any], None], row, key):
    add(row)
    try:
        yield row
    finally:
        remove(key)


def lookup(table: dict, name, what: str, plural: str, hint: str = ""):
    """table[name], or ValueError: "unknown <what> 'name'; known <plural>: <the names><hint>"."""
    if name not in table:
        raise ValueError(f"unknown {what} {name!r}; known {plural}: {', '.join(table)}{hint}")
    return table[name]
