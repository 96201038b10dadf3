"""The superposed engine's steps, readable with no model: its record, the drafts at any step, replay.

Superposed Decoding (speclab/decoding/superposed.py) keeps a beam of k drafts and writes one Round
per forward with nothing committed (emitted -1, kept 0): what a step decides is its
`SuperposedStep` record. The beam after step t is a list of entries, the alive drafts first (the k
the next forward superposes), then the finished ones (drafts that ended in the end-of-text
token and still score among the best k). Each entry points at its parent entry in step t-1's list (-1: the prompt) and
names the token it appended (-1: a finished draft carried over unchanged), so a draft is the walk
from an entry back to step 0.

    drafts_at(trace, step)      every entry of step `step`'s beam as token ids
    final_drafts(trace)         the k drafts the run returned, best first (sp_final of the last step)
    replay_beam(trace)          the output: the best final draft, rebuilt from the records alone
    check_beam(trace)           what the records must agree on (the Steps row's load check)

speclab.trace registers the engine's Steps row with these, so its traces load, replay and draw
wherever speclab.trace is imported.
"""
from __future__ import annotations

from typing import Any

from speclab.records import Record, record
from speclab.trace_schema import TraceError


@record("round", "superposed step")
class SuperposedStep(Record):
    """Superposed Decoding's step (one forward): the beam after it, alive drafts first, then the
    finished ones: each entry's parent entry in the step before (sp_parent; -1: the prompt), the
    token it appended (sp_token; -1: a finished draft carried over), its cumulative score
    (sp_score), whether it is alive (sp_alive: superposed into the next input); the next input's
    superposition weight of each entry (sp_weight; 0 for finished ones); the k x top-k candidates
    (sp_cand: [parent, token, LM log-prob, n-gram log-prob or null where the n-gram gives the token
    nothing, step score or null where it is -inf]), whether the no-support penalty applied per alive
    parent (sp_penalised); on the last step the entries returned, best first (sp_final)."""
    sp_parent: list[int] | None = None
    sp_token: list[int] | None = None
    sp_score: list[float] | None = None
    sp_alive: list[bool] | None = None
    sp_weight: list[float] | None = None
    sp_cand: list[list[Any]] | None = None
    sp_penalised: list[bool] | None = None
    sp_final: list[int] | None = None


def _walk(rounds, step: int, entry: int) -> list[int]:
    out = []
    while step >= 0 and entry >= 0:
        info = rounds[step].info
        tok = info["sp_token"][entry]
        if tok >= 0:
            out.append(tok)
        entry, step = info["sp_parent"][entry], step - 1
    return out[::-1]


def drafts_at(trace, step: int) -> list[list[int]]:
    """The token ids of every entry of the beam after step `step` (0-based), in its order."""
    n = len(trace.rounds[step].info.get("sp_token", []))
    return [_walk(trace.rounds, step, e) for e in range(n)]


def final_drafts(trace) -> list[list[int]]:
    """The drafts the run returned, best first (the output is the first)."""
    if not trace.rounds:
        return []
    last = len(trace.rounds) - 1
    return [_walk(trace.rounds, last, e) for e in trace.rounds[last].info.get("sp_final", [])]


def replay_beam(trace) -> list[int]:
    drafts = final_drafts(trace)
    return drafts[0] if drafts else []


def check_beam(trace) -> None:
    """Per step: the entry lists agree in length, every parent is an entry of the step before (the
    first step's are -1), a carried entry (token -1) is a finished one, and the last step names the
    entries it returned."""
    prev = None
    for i, r in enumerate(trace.rounds):
        where, info = f"rounds[{i}].info", r.info
        if "sp_parent" not in info or "sp_token" not in info:
            raise TraceError(f"{where} has no sp_parent / sp_token: a superposed step records its beam")
        n = len(info["sp_parent"])
        for key in ("sp_token", "sp_score", "sp_alive", "sp_weight"):
            if key in info and len(info[key]) != n:
                raise TraceError(f"{where}.{key} has {len(info[key])} entries for a beam of {n}")
        for j, (p, t) in enumerate(zip(info["sp_parent"], info["sp_token"])):
            if not (p == -1 if prev is None else 0 <= p < prev):
                raise TraceError(f"{where}.sp_parent[{j}] is {p}, not " + ("-1 (the prompt) on the first step"
                                 if prev is None else f"an entry of the step before (0 to {prev - 1})"))
            if t < -1 or t == -1 and (prev is None or info.get("sp_alive", [False] * n)[j]):
                raise TraceError(f"{where}.sp_token[{j}] is {t}: only a finished draft is carried over (-1)")
        prev = n
    last = trace.rounds[-1].info if trace.rounds else {}
    final = last.get("sp_final")
    if trace.rounds and (not final or any(not 0 <= e < prev for e in final)):
        raise TraceError(f"rounds[{len(trace.rounds) - 1}].info.sp_final is {final}: the last step names the "
                         f"entries it returned (0 to {prev - 1})")
