"""Typed records: the method-specific facts a round or a denoising step carries, declared.

A round (speculative engines) or a denoising step (diffusion) keeps what its method alone knows in
its `info` object: a skip mask, a draft model's version, how far a block was filled. Each such fact
belongs to one small record type declared here, a frozen dataclass whose fields are the `info`
keys it owns, each with its JSON type. On disk nothing changes (the keys sit in `info` as before, so
every saved trace still loads); what the declaration buys:

- loading checks every declared key's type (a hand-edited or damaged file fails in one line, naming
  the key, instead of inside a figure), and `undeclared(trace)` lists keys nobody declared (the
  suite runs every method with SPECLAB_STRICT_RECORDS=1, which refuses them when a trace is built);
- a figure declares the record it draws (`FigureSpec(record=SkipMask)`, figures.views), so it shows
  for every trace that holds that record, whatever method wrote it, and no view names a method;
- readers get typed values: `SkipMask.of(round)` is a SkipMask or None, `column(trace, SkipMask,
  "skip")` one value (or None) per step;
- docs/trace-format.md lists every record with its keys (`schema_table()`; a test keeps it current).

A method with facts of its own declares them beside its drafter or policy:

    from speclab.records import Record, record

    @record("round")
    class BeamLevel(Record):
        '''One level of the beam: the candidates kept and their scores.'''
        beam_kept: list | None = None
        beam_scores: list | None = None

and writes them with `tree.info.update(BeamLevel(beam_kept=..., beam_scores=...).info())`, or as
plain keys. A key belongs to one record type per level; `register_record` refuses a second owner.
"""
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


# -- a speculative round's records ---------------------------------------------------------------
@record("round")
class DraftShape(Record):
    """The draft the round offered: its shape (chain, static, dynamic, spectr, rsd), its length k or
    node count, a dynamic tree's budget and growth, SpecTr's chains (k of length L), RSD's branching,
    the head count and head forwards of a head drafter, and the tree's depth (per-position acceptance)."""
    shape: str | None = None
    k: int | None = None
    L: int | None = None
    nodes: int | None = None
    budget: int | None = None
    grown: int | None = None
    levels: int | None = None
    branches: list[int] | None = None
    depth: int | None = None
    heads: int | None = None
    head_forwards: int | None = None


@record("round")
class SkipMask(Record):
    """Which layers ran: a character a layer ("." runs, "a" attention skipped, "m" MLP skipped, "x"
    both), of SWIFT's draft, Unified Layer Skipping's forward, or layer-skip's exit (exit_layer)."""
    skip: str | None = None
    exit_layer: int | None = None


@record("round")
class CostGate(Record):
    """The cost gate's choice this round (gate: "spec" or "ar" and why) and the speeds it compared."""
    gate: str | None = None
    ar_tok_s: float | None = None
    spec_tok_s: float | None = None


@record("round")
class LookupMatch(Record):
    """A model-free drafter's match: the n-gram length (prompt lookup, lookahead), where it matched,
    the suffix match's length and position, and lookahead's window."""
    ngram: int | None = None
    match: int | None = None
    match_at: int | None = None
    where: int | None = None
    window: int | None = None


@record("round")
class BigramTable(Record):
    """ADED's adaptive table: entries learned, bigrams held, and the round's explore / exploit counts."""
    learned: int | None = None
    bigrams: int | None = None
    explore: int | None = None
    exploit: int | None = None


@record("round")
class RecyclingTable(Record):
    """Token recycling's adjacency table: candidates kept per token (width)."""
    width: int | None = None


@record("round")
class BeamSearch(Record):
    """RSD-S's stochastic beam (tree-rsd-s): sequences kept per level (beam_width), and per level how
    many of the beam's sequences kept no child (beam_truncated: cut early); each level's candidates
    and scores are the round's `tree-rsd-s` decisions."""
    beam_width: int | None = None
    beam_truncated: list[int] | None = None


@record("round")
class DraftVersion(Record):
    """An online-distilled draft (OSD): the version that drafted this round, and seconds spent
    updating it after the round (update_s)."""
    draft_version: int | None = None
    update_s: float | None = None


@record("round")
class PearlMode(Record):
    """PEARL's mode for the round (pre-verify or post-verify) and its draft length gamma."""
    mode: str | None = None
    gamma: int | None = None


@record("round")
class BlockFill(Record):
    """A block drafter (dllm-draft, flexdraft): the denoising forwards it took to fill the block."""
    steps: int | None = None


@record("round")
class StopReason(Record):
    """Why a stopping rule (SpecDec++) ended the draft: "head", "max", "eos"."""
    stop: str | None = None


@record("round")
class SyntheticRound(Record):
    """Synthetic acceptance: the draft passes it ran, and rounds drafted off the reference answer."""
    passes: int | None = None
    off_reference: bool | None = None


@record("round")
class HeadCoverage(Record):
    """A feature head's round: the emitted token when no head candidate covered it (coverage_miss),
    the copy nodes grafted into the tree (grafted), and the head's leaves pruned to make room for
    them (pruned: Graft), or, where a long enough copy drafted alone and the head rested, the
    match's length (overridden: eagle's override=N, TensorRT-LLM's suffix-automaton enhancer)."""
    coverage_miss: int | None = None
    grafted: int | None = None
    pruned: int | None = None
    overridden: int | None = None


@record("round")
class TreeFit(Record):
    """A draft tree sized to this machine's verify costs (eagle's budget=auto, decoding.costs): the
    nodes kept of those grown (fit_nodes), the tokens the round expected to commit (fit_expect: 1 +
    the calibrated cumulative draft probability of the kept nodes), its expected cost in one-row
    forwards (fit_cost: the verify of 1 + n rows plus the drafting), the calibration so far
    (fit_scale: tokens accepted over probability predicted) and, on the first such round, the
    measured c(T) for T = 1, 2, ... rows (fit_curve)."""
    fit_nodes: int | None = None
    fit_expect: float | None = None
    fit_cost: float | None = None
    fit_scale: float | None = None
    fit_curve: list | None = None


@record("round")
class DrafterSource(Record):
    """Where an EAGLE-3 drafter came from: its checkpoint format and source."""
    drafter: dict[str, Any] | None = None


@record("round")
class RetrievedSlice(Record):
    """RAPID's RAG drafter: the spans [start, end) of the target's context its draft reads this round
    (the retrieved chunks, then the query and the text since), and the context length each model
    attends over (draft_ctx, full_ctx: the two KV caches)."""
    rag_spans: list[list[int]] | None = None
    draft_ctx: int | None = None
    full_ctx: int | None = None


@record("round")
class Handoff(Record):
    """FoReaL's round: who wrote its tokens (owner: "leader", one token of the target; "draft", a
    chain the draft wrote and the target only read, then the leader's next token), the sentence the
    round began in (0-based), and the offsets among its committed tokens where a sentence started."""
    owner: str | None = None
    sentence: int | None = None
    starts: list[int] | None = None


@record("round")
class DraftLength(Record):
    """A learned length policy's choice (SpecKV): the draft length it chose for the round (chosen_k)
    and the draft-side features it read, the draft's confidence (max q) and entropy (nats) at the
    round's first draft position."""
    chosen_k: int | None = None
    confidence: float | None = None
    entropy: float | None = None


@record("round")
class RetrievalFusion(Record):
    """RASD's round: the retrieval tree's nodes (rasd_found) after a suffix match of rasd_match
    tokens, the nodes pruned with their branches because the draft gave the branch's first token
    too little probability (rasd_pruned), the kept nodes already in the draft's tree (rasd_shared:
    source "both") and those added below it (rasd_added)."""
    rasd_match: int | None = None
    rasd_found: int | None = None
    rasd_pruned: int | None = None
    rasd_shared: int | None = None
    rasd_added: int | None = None


# -- a denoising step's records ------------------------------------------------------------------
@record("step")
class NoiseCanvas(Record):
    """A noise-canvas sampler's step (DiffusionGemma): the canvas kind ("noise"), the sampling
    temperature, the tokens sampled for the block's slots, and the positions it accepted."""
    canvas: str | None = None
    temperature: float | None = None
    sampled: list[int] | None = None
    accepted: list[int] | None = None


@record("step")
class ForcedCommit(Record):
    """Positions committed although nothing passed the threshold (one a step keeps decoding moving)."""
    forced: list[int] | None = None


@record("step")
class StepEntropy(Record):
    """The predictive entropy of each masked slot (nats), and an entropy-bounded policy's bound and sum."""
    entropy: list[float] | None = None
    entropy_bound: float | None = None
    entropy_sum: float | None = None
    mean_entropy: float | None = None


@record("step")
class TopKCommit(Record):
    """A fixed count committed this step (low confidence, Prophet's and SchED's per-step k)."""
    k: int | None = None


@record("step")
class EarlyFinish(Record):
    """An early-commit rule fired (finish): Prophet's logit gap, SchED's g, or a DiffusionGemma
    canvas that stopped changing (stable)."""
    finish: bool | None = None
    gap: float | None = None
    g: float | None = None
    stable: bool | None = None


@record("step")
class AdaptiveBlock(Record):
    """AdaBlock's block for the step, [start, end), set where the model's delimiter fell."""
    adaptive_block: list[int] | None = None


@record("step")
class Anchors(Record):
    """LocalLeap's anchor positions: confident slots whose neighbourhood commits with them."""
    anchors: list[int] | None = None


@record("step")
class FastForward(Record):
    """Fast-dLLM v2's forward: which cache it ran (forward), its sub-block, rows scored, the AR first
    token, and why the step ended."""
    forward: str | None = None
    sub_block: list[int] | None = None
    rows: int | None = None
    ar_first: int | None = None
    why: str | None = None


@record("step")
class EditState(Record):
    """A revising policy (LLaDA 2.1 editing, R2): steps since the last edit, why the block finished,
    each slot's agreement streak, and the edits made by each rule."""
    post_edit_step: int | None = None
    block_done: str | None = None
    streak: list[int] | None = None
    by_rule: dict[str, Any] | None = None


@record("step")
class EteRound(Record):
    """ETE's round: the information committed (nats), the explored slots' share of it, the nats so far
    (rounds >= them / budget), the slots explored and their entropy (nats), the commits outside the
    active block, the cascades [slot, size] of the slots the round before explored, and how many
    slots crossed the threshold since."""
    information: float | None = None
    explore_information: float | None = None
    information_total: float | None = None
    explored: list[int] | None = None
    explored_entropy: list[float | None] | None = None
    outside_block: int | None = None
    cascade: list[list[int]] | None = None
    crossed: int | None = None


@record("step")
class DraftVerifyStep(Record):
    """FreeDave's step: the drafts it offered, how many the verify accepted, the tree node it took,
    their order, the draft tree itself, and whether a verify forward ran."""
    drafts: int | None = None
    accepted_drafts: int | None = None
    accepted_node: int | None = None
    order: list[int] | None = None
    tree: list[Any] | None = None
    verified_forward: bool | None = None


@record("step")
class LearnedScore(Record):
    """Learn2PD's filter: each slot's learned score (None: not eligible), and whether the end of text
    was committed this step."""
    score: list[float | None] | None = None
    end_of_text: int | None = None


# every record name, for the docs test and `speclab` help
def names() -> list[str]:
    return [f"{level}: {name}" for level in LEVELS for name in sorted(RECORDS[level])]

