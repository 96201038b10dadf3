"""Small helpers the figure modules share: token display, number formatting, hover text, axes."""
from __future__ import annotations

import html
import re

from speclab.trace import Trace, TraceError


def show_token(text: str) -> str:
    """A token as it should look in a cell: whitespace made visible, never empty. A run of 3 or more
    spaces (code indentation) reads as a count, "·×8", which a projector shows where eight dots blur."""
    t = text.replace("\n", "⏎").replace("\t", "⇥")
    t = re.sub(r" {3,}", lambda m: f"·×{len(m.group())}", t).replace(" ", "·")
    return t or "∅"


def tok(trace: Trace, token: int | None) -> str:
    """A token for plotly text and hover: <, > and & escaped (plotly reads a subset of HTML), quotes
    left alone (plotly decodes only a few named entities: `&quot;` would show as written); "?" for
    None, a token the trace did not record."""
    if token is None:
        return "?"
    return html.escape(show_token(trace.text_of(token)), quote=False)


def num(x, digits: int = 4) -> str:
    """p, q, u for hover: 4 significant digits, '—' when not recorded. A value a method recorded
    free-form (a round's info, a decision's inputs) may be no number at all: it shows as written."""
    if x is None or x != x:      # None or NaN
        return "—"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return html.escape(str(x)[:60])
    return f"{x:.{digits}g}"


def per_position(info: dict, key: str, n: int) -> list | None:
    """A free-form list a step recorded with one entry per masked position (its `entropy`), or None
    where it is absent or not such a list."""
    v = info.get(key)
    return v if isinstance(v, list) and len(v) == n else None


def topk_text(trace: Trace, topk) -> str:
    if not topk:
        return ""
    return ", ".join(f"{tok(trace, t)} {p:.3f}" for t, p in topk)


def bare_axis(**kw) -> dict:
    return dict(showgrid=False, zeroline=False, showticklabels=False, **kw)


def check_step(trace: Trace, step: int | None, n: int) -> int | None:
    """Step -1 means the last one, like a list index; out of range is a clear error."""
    if step is None:
        return None
    if not n:
        raise TraceError(f"this {trace.engine} trace has no steps to show")
    if not -n <= step < n:
        raise ValueError(f"step {step} is out of range: this trace has {n} steps (0..{n - 1})")
    return step % n
