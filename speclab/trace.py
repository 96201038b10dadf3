"""The trace: the contract between engines (which write it) and views (which read it).

Schema "speclab.trace/2" (a /1 file loads: /2 only added fields with defaults). Plain
dataclasses, saved as JSON (never pickle), checked on load. One Trace holds one run of one engine:

  speculative  `rounds`:   one Round per target forward (the AR baseline is a round with no draft)
  diffusion    `denoise`:  one DenoiseStep per model forward
  dag          `dag`:      one DagRun (graph summary plus each decoding strategy's path)

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
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from speclab import metrics

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


# what a denoising step's threshold is compared with: a position's top-1 probability (Fast-dLLM,
# LocalLeap), the factor of Fast-dLLM's rank-dependent bound, or a top-1 / top-2 logit gap
# (Prophet, SchED). Figures draw a threshold line on the confidence axis for "probability" only.
THRESHOLD_SCALES = ("probability", "factor", "logit-gap")


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
    engine: str                         # "speculative" | "diffusion" | "dag"
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
        tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
        tmp.replace(path)
        return path

    @classmethod
    def from_dict(cls, d: dict) -> "Trace":
        check_schema(d)
        try:
            return cls(
                engine=d["engine"], method=d["method"], params=d.get("params", {}), guarantee=d.get("guarantee"),
                models={k: ModelInfo(**v) for k, v in d.get("models", {}).items()},
                sampling=Sampling(**d.get("sampling", {})), record=d.get("record"),
                prompt_ids=list(d["prompt_ids"]), output_ids=list(d["output_ids"]),
                token_text={int(k): v for k, v in d.get("token_text", {}).items()},
                totals=Totals(**d.get("totals", {})),
                rounds=[_round(r) for r in d.get("rounds", [])],
                denoise=[_denoise(s) for s in d.get("denoise", [])],
                dag=DagRun(**d["dag"]) if d.get("dag") else None,
                lanes=[Lane(l["name"], [Span(**sp) for sp in l.get("spans", [])]) for l in d.get("lanes", [])],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"corrupted trace: {e!r}; re-record it with `speclab run --trace`") from e

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
    def text_of(self, token: int) -> str:
        return self.token_text.get(int(token), f"<{token}>")

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
    if name != SCHEMA_NAME or not version.isdigit():
        raise TraceError(f"unknown trace schema {d['schema']!r}; expected {SCHEMA!r}")
    if int(version) > SCHEMA_VERSION:
        raise TraceError(f"trace schema {d['schema']!r} is newer than this speclab ({SCHEMA}); "
                         "upgrade speclab (pip install -U speclab) to open it")


def _round(r: dict) -> Round:
    r = dict(r)
    r["nodes"] = [DraftNode(**n) for n in r.get("nodes", [])]
    r["decisions"] = [Decision(**x) for x in r.get("decisions", [])]
    return Round(**r)


def _denoise(s: dict) -> DenoiseStep:
    s = dict(s)
    s["block"] = tuple(s["block"])
    s["edits"] = [Edit(**e) for e in s.get("edits", [])]
    s["decisions"] = [Decision(**x) for x in s.get("decisions", [])]
    return DenoiseStep(**s)


def replay(trace: Trace) -> list[int]:
    """The new token ids, rebuilt from the recorded events alone (not from `output_ids`)."""
    if trace.engine == "speculative":
        return [t for r in trace.rounds for t in r.tokens]
    if trace.engine == "diffusion":
        return _replay_denoise(trace)
    if trace.engine == "dag":
        return list(trace.dag.outputs[trace.dag.chosen]) if trace.dag else []
    raise TraceError(f"unknown engine {trace.engine!r}")


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
            canvas[pos] = proposed[pos]
    out = _strip_after_eos(canvas, trace.params.get("eos_id"))
    if None in out:
        raise TraceError(f"position {out.index(None)} was never committed before the end of text")
    return out


def _strip_after_eos(tokens: list[int], eos: int | None) -> list[int]:
    if eos is not None and eos in tokens:
        return tokens[: tokens.index(eos) + 1]
    return list(tokens)

