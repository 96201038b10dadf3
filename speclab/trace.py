"""The trace: the contract between engines (which write it) and views (which read it).

Schema "speclab.trace/2" (a /1 file loads: /2 only added fields with defaults). Plain
dataclasses, saved as JSON (never pickle), checked on load. One Trace holds one run of one engine:

  speculative  `rounds`:   one Round per target forward (the AR baseline is a round with no draft)
  diffusion    `denoise`:  one DenoiseStep per model forward
  dag          `dag`:      one DagRun (graph summary plus each decoding strategy's path)
  superposed   `rounds`:   one Round per forward, its beam of k drafts a record (speclab/beam.py)

Which field holds an engine's steps, how many a player walks, how they replay, and what a step and
the rate are called is the engine's `Steps` row (STEPS, `steps_of(trace)`): replay, metrics, the
views and the bench read the row, never the engine's name. A new engine registers its own
(`register_steps`, done by decoding.engines.register_engine) and every reader follows.

Faithfulness: `replay(trace)` rebuilds the output token ids from the recorded events alone, and
`totals` holds the forwards the models really ran. Recording levels: "full" adds top-k
distributions, "light" keeps tokens, p, q and decisions, None keeps totals and, per round, only
the committed tokens (no per-node records), so replay works at every level.

What any method decides beyond the engine's own loop is a `Decision` (policy, the input features it
read, the threshold it compared them with, its output), kept on the round or step it shaped, so
every view can show it without knowing the method. Draft nodes keep each acceptance rule's verdict
(`verdicts`) beside the ruling one; a diffusion step keeps its `edits` (a committed token re-masked
or rewritten); work that overlaps in time (drafting beside verifying) is drawn from `lanes`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from speclab import beam, metrics, records
from speclab.trace_check import at_least, check_canvas, check_dag, check_round, ids, prob
from speclab.trace_schema import (ACCEPTED, DECISIONS, EMITTED_KINDS, MASK, MAX_CANVAS, MAX_DRAFT,  # noqa: F401
                                  MAX_JSON_DEPTH, MAX_NUMBER, MAX_TOKEN_ID, MAX_TRACE_BYTES, NOT_REACHED,
                                  RECORD_LEVELS, REJECTED, SCHEMA, SCHEMA_NAME, SCHEMA_VERSION, THRESHOLD_SCALES,
                                  TraceError, _bad, _build, _int, _kind, check_schema, json_depth, parse_json)


@dataclass
class ModelInfo:
    name: str
    params: int
    dtype: str
    device: str
    backend: str | None = None      # the forward that ran it (LeanLM, StaticLM, CausalLM, ...); None: not recorded
    graphs: bool | None = None      # its forwards replayed captured CUDA graphs
    kernel: str | None = None       # the CPU kernel path it ran on (avx2, avx512, avx512bf16, amx); None: none

    def runs_on(self) -> str:
        """Where and how it ran, for a view: "bfloat16 on cuda, StaticLM, CUDA graphs"."""
        return ", ".join([f"{self.dtype} on {self.device}"] + ([self.backend] if self.backend else [])
                         + ([f"kernel {self.kernel}"] if self.kernel else []) + (["CUDA graphs"] if self.graphs else []))


@dataclass
class Sampling:
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int = 0


@dataclass
class Totals:
    wall_s: float = 0.0
    target_forwards: int = 0
    draft_forwards: int = 0
    new_tokens: int = 0
    drafted: int = 0           # draft tokens offered to the target
    accepted: int = 0          # draft tokens the target accepted
    draft_s: float = 0.0
    verify_s: float = 0.0

    @property
    def tau(self) -> float:
        """Mean accepted length: new tokens per target forward (counts the bonus token)."""
        return metrics.tau(self.new_tokens, self.target_forwards)

    @property
    def alpha(self) -> float | None:
        """Acceptance rate: accepted draft tokens / drafted tokens (None when nothing drafted)."""
        return metrics.alpha(self.accepted, self.drafted)


@dataclass
class Decision:
    """One decision of a policy: what it read, what it compared with, what it chose. E.g. a stopping
    rule at draft depth 3: policy "specdec++", inputs {"p_accept": 0.81, "p_any_reject": 0.42},
    threshold 0.3, output "stop", at 3."""
    policy: str
    inputs: dict[str, Any] = field(default_factory=dict)   # feature -> number, string or short list
    threshold: float | None = None
    output: Any = None                  # the choice: "stop" / "go", a length, positions, a layer set, ...
    at: int | None = None               # the draft depth, node or canvas position it concerns
    note: str = ""


@dataclass
class Span:
    """One stretch of work on a lane: seconds from the start of the decode."""
    start_s: float
    end_s: float
    what: str                           # "draft", "verify", "pre-verify", ...
    step: int                           # the round / denoising step it belongs to (0-based)


@dataclass
class Lane:
    """A thread or stream of work; lanes overlap in time where drafting runs beside verifying."""
    name: str
    spans: list[Span] = field(default_factory=list)


@dataclass
class Edit:
    """A diffusion step taking back (after == MASK) or rewriting a position it had committed."""
    pos: int
    before: int                         # the token there before (MASK: it was masked)
    after: int                          # the token there after (MASK: re-masked)
    reason: str = ""


@dataclass
class DraftNode:
    """One drafted token. parent = -1 means a child of the last committed token."""
    id: int
    parent: int
    token: int
    depth: int                          # 1 for children of the committed token
    q: float | None = None              # draft probability of `token` (1.0 for point-mass drafts)
    source: str = ""                    # which drafter / which n-gram / which exit layer
    p: float | None = None              # target probability of `token` at this node
    decision: str = NOT_REACHED
    u: float | None = None              # the uniform draw, where one was drawn
    rule: str = ""                      # the acceptance rule that decided
    try_order: int | None = None        # order in which siblings were tried
    verdicts: dict[str, str] = field(default_factory=dict)  # rule -> its decision, where several rules judged
    q_topk: list[list[float]] | None = None   # [[token, prob], ...] with record="full"
    p_topk: list[list[float]] | None = None


@dataclass
class Round:
    """One target forward of the draft/verify loop."""
    nodes: list[DraftNode] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)   # node ids on the accepted path, in order
    path_tokens: list[int] = field(default_factory=list)  # their tokens (kept at every level)
    emitted: int = -1                   # the correction or bonus token the target supplied
    emitted_kind: str = "bonus"         # "bonus" (whole path accepted) | "correction" | "target"
    kept: int = 0                       # tokens of this round kept (fewer at EOS / max_new_tokens)
    drafted: int = 0                    # draft nodes offered to the target
    residual_topk: list[list[float]] | None = None  # distribution the emitted token came from
    draft_s: float = 0.0
    verify_s: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)  # facts about the round: k, exit layer, ...
    decisions: list[Decision] = field(default_factory=list)   # what policies decided, with their inputs

    @property
    def tokens(self) -> list[int]:
        return (self.path_tokens + [self.emitted])[: self.kept]



@dataclass
class DenoiseStep:
    """One forward of a masked-diffusion decoder."""
    block: tuple[int, int]                              # [start, end) of the active block
    masked: list[int]                                   # positions masked before the step
    top1: list[int] = field(default_factory=list)       # per masked position
    conf: list[float] = field(default_factory=list)     # top-1 probability
    margin: list[float] = field(default_factory=list)   # top-1 minus top-2 probability
    committed: list[int] = field(default_factory=list)  # positions unmasked by this step
    committed_tokens: list[int] = field(default_factory=list)  # their tokens where not all top1 (FreeDave's tree)
    remasked: list[int] = field(default_factory=list)
    threshold: float | None = None                      # the policy's threshold or score
    threshold_scale: str | None = None                  # what `threshold` measures (THRESHOLD_SCALES)
    tokens: list[int] = field(default_factory=list)     # generation-region tokens after the step
    info: dict[str, Any] = field(default_factory=dict)
    edits: list[Edit] = field(default_factory=list)     # committed positions re-masked or rewritten
    decisions: list[Decision] = field(default_factory=list)


@dataclass
class DagRun:
    """A Directed Acyclic Transformer run: the graph summary and every strategy's path."""
    num_vertices: int
    emissions_topk: list[list[list[float]]] = field(default_factory=list)  # [v][[tok, p], ...]
    links_topk: list[list[list[float]]] = field(default_factory=list)      # [v][[u, p], ...]
    pass_prob: list[float] = field(default_factory=list)
    paths: dict[str, list[int]] = field(default_factory=dict)     # strategy -> vertex path
    outputs: dict[str, list[int]] = field(default_factory=dict)   # strategy -> token ids
    chosen: str = ""                                              # strategy whose output is `output_ids`
    valid: dict[str, bool] = field(default_factory=dict)          # strategy -> its output is a right answer


@dataclass
class Trace:
    engine: str                         # a key of STEPS: "speculative" | "diffusion" | "dag" | a registered one
    method: str
    params: dict[str, Any] = field(default_factory=dict)
    guarantee: str | None = None        # what the output is held to (decoding/guarantees.py); None: not recorded
    models: dict[str, ModelInfo] = field(default_factory=dict)   # role -> model
    sampling: Sampling = field(default_factory=Sampling)
    record: str | None = "light"
    prompt_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)          # new tokens only
    token_text: dict[int, str] = field(default_factory=dict)
    totals: Totals = field(default_factory=Totals)
    rounds: list[Round] = field(default_factory=list)
    denoise: list[DenoiseStep] = field(default_factory=list)
    dag: DagRun | None = None
    lanes: list[Lane] = field(default_factory=list)     # timing lanes where work overlapped (empty: one lane)
    schema: str = SCHEMA

    # -- JSON ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["token_text"] = {str(k): v for k, v in self.token_text.items()}
        return d

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")   # never leave a half-written trace behind
        try:
            tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
            tmp.replace(path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        """A trace from its JSON object, every field checked (types, ranges, references: see
        `check_trace`), so replay and every view can trust what they read; TraceError says what is wrong."""
        check_schema(d)
        trace = _build(cls, {k: v for k, v in d.items() if k != "schema"}, "the trace")
        check_trace(trace)
        return trace

    @classmethod
    def from_json(cls, data: str | bytes, name: str = "the trace", limit: int = MAX_TRACE_BYTES) -> "Trace":
        """A trace from JSON text or bytes, its size and nesting bounded before it is parsed."""
        return cls.from_dict(parse_json(data, name, limit))

    @classmethod
    def load(cls, path: str | Path, limit: int = MAX_TRACE_BYTES) -> "Trace":
        path = Path(path)
        if not path.exists():
            raise TraceError(f"trace file not found: {path}")
        size = path.stat().st_size
        if size > limit:
            raise TraceError(f"{path} is {size / 2**20:.0f} MB, more than a trace file may be "
                             f"({limit / 2**20:.0f} MB): is it a speclab trace?")
        return cls.from_json(path.read_bytes(), str(path), limit)

    # -- helpers for views -----------------------------------------------------------------
    def steps_row(self) -> "Steps":
        """How this trace's engine holds its steps (STEPS): what readers ask instead of its name."""
        return steps_of(self)

    def text_of(self, token: int) -> str:
        """A token id's text; "<id>" where the trace has none, and a value that is no id (one a
        method recorded free-form) in angle brackets as written."""
        if isinstance(token, float) and token.is_integer():
            token = int(token)
        return self.token_text.get(token, f"<{token}>") if type(token) is int else f"<{str(token)[:40]}>"

    def mentioned_ids(self) -> set[int]:
        """Every token id a view can show: prompt, output, draft nodes, emitted tokens, every
        recorded top-k candidate (p, q, residual), a diffusion step's proposals and canvas, a DAG's
        emissions and outputs. Engines fill `token_text` from this, so no view shows an id."""
        ids = set(self.prompt_ids) | set(self.output_ids)
        tops = []
        for r in self.rounds:
            ids.update(n.token for n in r.nodes)
            ids.update(r.path_tokens)
            if r.emitted >= 0:
                ids.add(r.emitted)
            tops += [n.p_topk for n in r.nodes] + [n.q_topk for n in r.nodes] + [r.residual_topk]
        for s in self.denoise:
            ids.update(s.top1)
            ids.update(s.tokens)
            ids.update(s.committed_tokens)
            ids.update(t for e in s.edits for t in (e.before, e.after) if t != MASK)
        if self.dag is not None:
            tops += self.dag.emissions_topk
            ids.update(t for out in self.dag.outputs.values() for t in out)
        ids.update(int(t) for top in tops if top for t, _ in top)
        return {int(i) for i in ids}




def check_trace(t: Trace) -> None:
    """What a trace's fields must agree on beyond their types (TraceError names the first field that
    does not): the engine and level are known ones, ids are token ids, probabilities lie in [0, 1],
    a draft tree is a tree, positions lie on the canvas, vertices in the graph, spans in the run."""
    row = STEPS.get(t.engine)
    if row is None:
        raise _bad("engine", f"is {t.engine!r}, not one of {', '.join(STEPS)}")
    if t.record not in RECORD_LEVELS:
        raise _bad("record", f"is {t.record!r}, not \"full\", \"light\" or null")
    ids(t.prompt_ids, "prompt_ids")
    ids(t.output_ids, "output_ids")
    s = t.sampling
    at_least(s.temperature, 0, "sampling.temperature")
    if s.top_k is not None:
        at_least(s.top_k, 0, "sampling.top_k")
    if s.top_p is not None:
        prob(s.top_p, "sampling.top_p")
    for f in fields(Totals):
        at_least(getattr(t.totals, f.name), 0, f"totals.{f.name}")
    for i, r in enumerate(t.rounds):
        check_round(r, f"rounds[{i}]")
        records.check_info(r.info, "round", f"rounds[{i}]")
    for i, s in enumerate(t.denoise):
        records.check_info(s.info, "step", f"denoise[{i}]")
    if row.check is not None:
        row.check(t)
    if t.dag is not None:
        check_dag(t.dag)
    for i, lane in enumerate(t.lanes):
        for j, sp in enumerate(lane.spans):
            where = f"lanes[{i}].spans[{j}]"
            if sp.end_s < sp.start_s:
                raise _bad(where, f"ends ({sp.end_s}) before it starts ({sp.start_s})")
            at_least(sp.step, 0, f"{where}.step")


def replay(trace: Trace) -> list[int]:
    """The new token ids, rebuilt from the recorded events alone (not from `output_ids`)."""
    return steps_of(trace).replay(trace)


def _replay_denoise(trace: Trace) -> list[int]:
    """Fill the canvas step by step: first the step's edits (a committed position re-masked or
    rewritten), then every committed position's token (its proposal, unless the step lists the
    committed tokens)."""
    canvas: list[int | None] = [None] * int(trace.params.get("gen_length", 0))
    for i, s in enumerate(trace.denoise):
        for e in s.edits:
            if canvas[e.pos] != (None if e.before == MASK else e.before):
                raise TraceError(f"step {i + 1} edits position {e.pos} from {e.before}, but it holds {canvas[e.pos]}")
            canvas[e.pos] = None if e.after == MASK else e.after
        proposed = dict(zip(s.committed, s.committed_tokens)) if s.committed_tokens else dict(zip(s.masked, s.top1))
        for pos in s.committed:
            if canvas[pos] is not None:
                raise TraceError(f"position {pos} committed while it holds a token (re-mask it first: an Edit)")
            if pos not in proposed:
                raise TraceError(f"step {i + 1} commits position {pos} but records no token for it")
            canvas[pos] = proposed[pos]
    out = _strip_after_eos(canvas, trace.params.get("eos_id"))
    if None in out:
        raise TraceError(f"position {out.index(None)} was never committed before the end of text")
    return out


def _strip_after_eos(tokens: list[int], eos: int | None) -> list[int]:
    if eos is not None and eos in tokens:
        return tokens[: tokens.index(eos) + 1]
    return list(tokens)


# -- how each engine's trace holds its steps ---------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Steps:
    """How one engine's traces hold their steps: the facts replay, metrics, the views and the bench
    read instead of comparing engine names. decoding/engines.py gives each Engine row one."""
    engine: str                                     # the name a trace records in `engine`
    field: str                                      # the Trace field holding the steps: rounds | denoise | dag
    noun: str                                       # one step as a person reads it: "round", "step", ...
    rate: str                                       # new tokens per target forward, as this engine calls it
    count: Callable[[Trace], int]                   # how many steps a player walks through
    replay: Callable[[Trace], list[int]]            # the new token ids from the steps alone
    names: Callable[[Trace], list[str]] | None = None   # slider labels (None: 1, 2, 3, ...)
    verify: bool = False                            # steps are draft / verify rounds: p, q, paths, a cost model
    canvas: bool = False                            # steps denoise a canvas of gen_length slots
    check: Callable[[Trace], None] | None = None    # what the steps must agree on beyond their types


def _round_tokens(trace: Trace) -> list[int]:
    return [t for r in trace.rounds for t in r.tokens]


def _dag_output(trace: Trace) -> list[int]:
    return list(trace.dag.outputs[trace.dag.chosen]) if trace.dag else []


def _dag_strategies(trace: Trace) -> list[str]:
    return list(trace.dag.paths) if trace.dag is not None else []


STEPS: dict[str, Steps] = {s.engine: s for s in (
    Steps(engine="speculative", field="rounds", noun="round", rate="tau", count=lambda t: len(t.rounds),
          replay=_round_tokens, verify=True),
    Steps(engine="diffusion", field="denoise", noun="step", rate="tokens per forward",
          count=lambda t: len(t.denoise), replay=_replay_denoise, canvas=True, check=check_canvas),
    Steps(engine="dag", field="dag", noun="strategy", rate="tau", count=lambda t: len(_dag_strategies(t)),
          replay=_dag_output, names=_dag_strategies),
    # Superposed Decoding: one step a forward, k drafts in a beam, nothing committed (speclab/beam.py)
    Steps(engine="superposed", field="rounds", noun="step", rate="tokens per forward",
          count=lambda t: len(t.rounds), replay=beam.replay_beam, check=beam.check_beam),
)}


def steps_of(trace: Trace) -> Steps:
    """The Steps row of a trace's engine; TraceError for an engine nobody registered."""
    row = STEPS.get(trace.engine)
    if row is None:
        raise TraceError(f"unknown engine {trace.engine!r} (known: {', '.join(STEPS)}): register its "
                         "Engine row (speclab.decoding.engines.register_engine) before reading its traces")
    return row


def register_steps(row: Steps) -> Steps:
    """Let traces of a new engine load, replay and be read (register_engine calls this)."""
    if STEPS.get(row.engine, row) is not row:
        raise ValueError(f"an engine named {row.engine!r} already has its Steps row: unregister it first")
    if row.field not in {f.name for f in fields(Trace)}:
        raise ValueError(f"Steps {row.engine!r}: field {row.field!r} is no Trace field; steps live in one of "
                         "rounds, denoise, dag")
    STEPS[row.engine] = row
    return row


def unregister_steps(engine: str) -> None:
    STEPS.pop(engine, None)
