"""What the dashboard runs, with no UI in sight: which models and methods exist, how the parameter
widgets map onto a method's keyword arguments, one decode, a comparison table, and reading an
uploaded trace. Every function here is plain Python, so the tests call them without a browser.

Where and when a decode runs (workers, the queue, a model's turn, process settings, limits) is
the RunService's business (service.py); everything a user sees lives in the session.
"""
from __future__ import annotations

import html
import json
from pathlib import Path

from speclab import metrics
from speclab.decoding.registry import get_method, method_params, methods
from speclab.models.zoo import zoo_names, zoo_path
from speclab.params import parse_assignment  # the same NAME=VALUE parsing as --param
from speclab.trace import Trace, TraceError

MAX_UPLOAD_BYTES = 8 * 1024 * 1024     # a 128-token run recorded "full" is well under 1 MB
DAG_STRATEGIES = ("viterbi", "greedy", "lookahead", "beam", "sample", "vanilla", "all")


# -- what can be chosen ---------------------------------------------------------------------------
def zoo_models() -> dict[str, list[str]]:
    """Zoo names by kind: {"causal": [...], "dag": [...], "diffusion": [...]}; a DA-Transformer
    and a masked-diffusion LM say so in their configs."""
    import importlib.util
    from speclab.models.gguf import PACKAGED
    from speclab.models.zoo import REAL
    # the real pretrained LMs first, when their wheel is installed (they load offline from it)
    kinds = {"causal": [n for n in REAL if importlib.util.find_spec(PACKAGED[n].package)], "dag": [], "diffusion": []}
    for name in zoo_names():
        cfg = json.loads((zoo_path(name) / "config.json").read_text())
        if cfg.get("speclab_adapter", {}).get("kind") in ("eagle", "medusa", "clover"):
            continue            # feature heads decode nothing alone: methods pick them (registry: Method.draft.paired)
        kind = ("dag" if cfg.get("model_type") == "da-transformer"
                else "diffusion" if cfg.get("speclab_engine") == "diffusion" or cfg.get("model_type") == "diffusion_gemma"
                else "causal")
        kinds[kind].append(name)
    return kinds


def method_names() -> list[str]:
    """Every method of the registry (speculative, DAG strategies, diffusion policies), once each."""
    names = [m["name"] for m in methods()]
    return names + [f"dag-{s}" for s in DAG_STRATEGIES if f"dag-{s}" not in names]


def engine(method: str) -> str:
    """The name of the method's engine (its registry row's): the key of per-engine tables."""
    return get_method(method).engine


def engine_row(method: str):
    """The method's Engine row (decoding/engines.py): what the page asks instead of comparing names."""
    from speclab.decoding.engines import get_engine
    return get_engine(engine(method))


def verifies(method: str) -> bool:
    """A target verifies drafts: rounds, a rule, a cost model, max_new_tokens."""
    return engine_row(method).verify


def on_canvas(method: str) -> bool:
    """Steps denoise a canvas of gen_length slots (a diffusion policy)."""
    return engine_row(method).steps.canvas


def model_kind(method: str) -> str:
    """The zoo_models() kind a method needs: its engine's model kind."""
    return engine_row(method).kind


def is_dag(method: str) -> bool:
    """A DA-Transformer's strategy: its own word-level inputs, one forward, no chat, no seed."""
    return model_kind(method) == "dag"


def same_engine(a: str, b: str) -> bool:
    return engine_row(a) is engine_row(b)


def needs_draft(method: str) -> bool:
    return not is_dag(method) and get_method(method).needs_draft


def takes(method: str) -> list[str]:
    """The parameter names a method accepts ([] for DAG strategies)."""
    return [] if is_dag(method) else method_params(method)


def method_kwargs(method: str, knobs: dict, extra: str = "") -> dict:
    """Keyword arguments for `speclab.generate`: the knobs this method takes, plus `extra`
    ("name=value, name=value", like the CLI's --param) passed through unchecked so that a
    parameter the method does not take reaches generate() and comes back as its ValueError."""
    kw = {k: v for k, v in knobs.items() if k in takes(method) and v is not None}
    for item in filter(None, (s.strip() for s in extra.replace("\n", ",").split(","))):
        if "=" not in item:
            raise ValueError(f"extra parameter {item!r} needs the form name=value, e.g. schedule=heuristic")
        name, value = parse_assignment(item)
        kw[name] = value
    return kw


# -- running --------------------------------------------------------------------------------------
def models_of(request: dict) -> tuple[str, ...]:
    """The model names a run_one request decodes with (the service gives a model one run at a time):
    its target, and its draft where the method takes a draft LM (run_one passes no other)."""
    method, draft = request["method"], request.get("draft")
    uses_draft = needs_draft(method) and get_method(method).draft_kind == "draft" and isinstance(draft, str)
    return (request["target"], draft) if uses_draft else (request["target"],)


def run_one(target: str, prompt: str, method: str, draft: str | None = None, max_new_tokens: int = 24,
            temperature: float = 0.0, seed: int = 0, record: str | None = "full", progress=None,
            **kw) -> Trace:
    """One decode -> its Trace. ValueError (from speclab) for anything the user got wrong."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("empty prompt: type some text to continue")
    return _run(target, prompt, method, draft, max_new_tokens, temperature, seed, record, progress, kw)


def _run(target, prompt, method, draft, max_new_tokens, temperature, seed, record, progress, kw):
    import speclab
    canvas = on_canvas(method)            # steps fill a canvas: progress in slots, lengths in slots
    kw["temperature"] = float(temperature)
    if canvas and progress:
        progress = _increments(progress)
    # the draft picker feeds draft-model methods; eagle / medusa take their target's head from the zoo
    if needs_draft(method) and get_method(method).draft_kind == "draft":
        kw["draft"] = draft
    seed = [int(s) for s in seed] if isinstance(seed, list) else int(seed)
    try:
        r = speclab.run(target, prompt, method, max_new_tokens=int(max_new_tokens), seed=seed, record=record,
                        progress=progress, **kw)
    except ValueError as e:
        if not canvas:
            raise
        # the shared context check counts new tokens: on a diffusion canvas they are slots
        raise ValueError(str(e).replace("max_new_tokens", "the gen length").replace("new tokens", "canvas slots")) from e
    return [x.trace for x in r] if isinstance(r, list) else r.trace


def batch_key(request: dict) -> tuple | None:
    """What run_one requests must share to run as one batch (run_batch): everything but the prompt
    and the seed; None where the request cannot run in a batch (its method, or its acceptance rule,
    decodes one prompt at a time). Batched, each request's output is its run alone, token for token
    (decoding/batch.py: a lane draws from its own generator); only its times are the batch's."""
    from speclab.decoding.rules import get_rule
    method = request.get("method")
    try:
        if not (get_method(method).batchable and engine_row(method).batch):
            return None
        if request.get("rule") and get_rule(request["rule"]).batch_refusal():
            return None
    except (KeyError, ValueError, TypeError):
        return None
    try:
        return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in request.items() if k not in ("prompt", "seed")))
    except TypeError:                     # a value JSON cannot say: run it alone
        return None


def run_batch(requests: list[dict], progress=None) -> list[Trace]:
    """Requests with one batch_key as one batched decode -> their traces, in order. progress(n)
    hears each lane's new tokens."""
    if any(not isinstance(r.get("prompt"), str) or not r["prompt"].strip() for r in requests):
        raise ValueError("empty prompt: type some text to continue")
    first = dict(requests[0])
    kw = {k: v for k, v in first.items() if k not in ("target", "prompt", "method", "draft", "max_new_tokens",
                                                      "temperature", "seed", "record")}
    return _run(first["target"], [r["prompt"] for r in requests], first["method"], first.get("draft"),
                first.get("max_new_tokens", 24), first.get("temperature", 0.0),
                [int(r.get("seed", 0)) for r in requests], first.get("record", "full"), progress, kw)


def _increments(progress):
    """The diffusion engine reports (positions committed so far, G); the dashboard counts new tokens."""
    last = [0]

    def report(committed: int, total: int) -> None:
        progress(committed - last[0])
        last[0] = committed
    return report


# -- comparing ------------------------------------------------------------------------------------
# each family's baseline in a comparison: (method, its name in the table)
BASELINE = {"speculative": ("ar", "ar"), "diffusion": ("dllm-lowconf", "one-per-step")}


def compare_speedups(measured, base: str) -> dict:
    """method -> timing.SpeedUp over `base` from an interleaved comparison (the base itself left out)."""
    return {m: measured.speedup(m, base) for m in measured.walls if m != base and measured.walls.get(base)}


def compare_rows(traces: dict[str, Trace], reference: Trace | None, ref: str = "ar", measured=None,
                 base: str = "ar") -> list[dict]:
    """The reference first (when given), then one row per method. `identical` compares output ids
    with the greedy reference (None when sampling, since a sampled run is lossless in distribution,
    not token for token). ref: the reference's name ("ar"; "one-per-step" for diffusion policies),
    which names the columns. measured: the comparison's timing.Interleaved (its median runs are
    `traces` and `reference`; `base` is the reference's method name in it): wall s is then the
    median of the timed runs with its min-max, the speed-up the median of the per-turn ratios with
    its min-max, and `timing` says whether to trust it and, if not, why. A method slower than the
    reference, faster or slower, says why in `why` (metrics.plain_reason: the cost model in words)."""
    same_col = "identical to greedy ar" if ref == "ar" else f"identical to {ref}"
    ups = compare_speedups(measured, base) if measured is not None and reference is not None else {}
    rows = []
    for name, t in ([(ref, reference)] if reference is not None else []) + list(traces.items()):
        tot = t.totals
        same = None if reference is None or t.sampling.temperature > 0 else t.output_ids == reference.output_ids
        key = base if t is reference else name
        wall = measured.cell(key) if measured is not None and key in measured.walls else None
        up = ups.get(name)
        if up is None:
            v = (1.0 if t is reference else
                 metrics.speedup(t.totals.wall_s, reference.totals.wall_s if reference is not None else None))
            up_text, spread, verdict = (None if v is None else f"{v:.2f}x"), "-", "-"
        else:
            up_text = f"{up.median:.2f}x"
            spread = f"{up.ratios.lo:.2f}-{up.ratios.hi:.2f}x"
            verdict = "reliable" if up.reliable else "unreliable: " + "; ".join(up.reasons)
        row = {"method": name, "new tokens": tot.new_tokens, "tau": round(tot.tau, 2),
               "alpha": None if (a := metrics.token_alpha(t.rounds)) is None else round(a, 2),
               "drafts kept": "-" if not tot.drafted else f"{tot.accepted}/{tot.drafted}",
               "target fwd": tot.target_forwards, "draft fwd": tot.draft_forwards,
               "wall s": round(wall.median if wall else tot.wall_s, 3),
               "wall s spread": f"{wall.lo:.3f}-{wall.hi:.3f}" if wall and wall.n > 1 else "-",
               f"speed-up vs {ref}": up_text, "spread": spread, "timing": verdict,
               same_col: ("reference" if t is reference else
                          {None: "n/a (sampling)", True: "yes", False: "NO"}[same])}
        if ref == "ar" and reference is not None and t is not reference:
            row["why"] = why(t, reference, up.median if up is not None else None)
        rows.append(row)
    return rows


def prefill_note(reference: Trace | None, measured=None, base: str = "ar") -> str:
    """What the prompt's forward costs in the comparison: ar's first round (the prefill) beside
    its whole run, and the ceiling that sets on every method's speed-up (they all prefill the same
    prompt first). "" where there is no speculative ar reference with timed rounds."""
    if reference is None or not reference.rounds or not reference.steps_row().verify:
        return ""
    first = reference.rounds[0].verify_s + reference.rounds[0].draft_s
    wall = measured.cell(base).median if measured is not None and base in measured.walls else reference.totals.wall_s
    if not first or not wall or first >= wall:
        return ""
    return (f"{base}'s prefill of the {len(reference.prompt_ids)}-token prompt took {first:.3f} s of its {wall:.3f} s "
            f"({first / wall:.0%}). Every method prefills the same prompt first, so none can beat "
            f"{wall / first:.1f}x here; a longer answer or a cheaper prefill raises that ceiling.")


def why(trace: Trace, reference: Trace, measured_speedup: float | None) -> str:
    """The cost model in words (metrics.plain_reason) for a speculative run against its ar
    reference, faster or slower; "-" where it has nothing to say (no timed rounds, another engine)."""
    if not trace.steps_row().verify:
        return "-"
    m = metrics.cost_model(trace, reference)
    if m is None:
        return "-"
    if measured_speedup is None:
        measured_speedup = metrics.speedup(trace.totals.wall_s, reference.totals.wall_s)
    return metrics.plain_reason(m, measured_speedup)


def cost_models(traces: dict[str, Trace], reference: Trace, spread: dict | None = None) -> dict:
    """method -> metrics.cost_model against the ar reference, for the speculative runs that drafted;
    the measured speed-up is the comparison's median ratio where one was measured (spread)."""
    out = {}
    for name, t in traces.items():
        m = metrics.cost_model(t, reference) if t.steps_row().verify and t.totals.drafted else None
        if m is not None and m["k"]:
            if spread and name in spread:
                m["measured_speedup"] = spread[name].median
            out[name] = m
    return out


def copy_history(history):
    """A SuffixHistory holding the same requests (a comparison's timed runs each start from it)."""
    from speclab.decoding.drafters.lookup import SuffixHistory
    new = SuffixHistory(history.max_tokens)
    with history.lock:
        docs = [(key, list(ids)) for (key, _), ids in history._docs.items()]
    for key, ids in docs:
        new.add(key, ids)
    return new


def rows_html(rows: list[dict]) -> str:
    cols = list(dict.fromkeys(c for r in rows for c in r))     # the reference row has no "why"
    head = "".join(f"<th style='padding:2px 10px;text-align:left'>{c}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td style='padding:2px 10px'>{html.escape(str('-' if r.get(c) is None else r[c]))}</td>"
                                    for c in cols) + "</tr>" for r in rows)
    return f"<table class='speclab-compare-table'><tr>{head}</tr>{body}</table>"


# -- traces in and out ----------------------------------------------------------------------------
def trace_from_upload(data: bytes | None, filename: str | None = None, limit: int = MAX_UPLOAD_BYTES) -> Trace:
    """The uploaded bytes as a Trace, or TraceError saying what is wrong with them."""
    name = filename or "the upload"
    if not data:
        raise TraceError(f"{name} is empty: choose a trace saved by speclab (a .json file)")
    if len(data) > limit:
        raise TraceError(f"{name} is {len(data) / 2**20:.1f} MB, over the {limit / 2**20:.0f} MB limit for "
                         "uploads: open it in a notebook with speclab.Trace.load instead")
    return Trace.from_json(data, name, limit)     # bounds the nesting depth before parsing


def trace_json(trace: Trace) -> bytes:
    return json.dumps(trace.to_dict(), separators=(",", ":")).encode("utf-8")


def prompt_text(trace: Trace) -> str:
    """The prompt as the trace itself records it (token table), not as a widget holds it."""
    if trace.dag is not None:           # a DA-Transformer's input: its words, without the markers
        return "".join(trace.text_of(t) for t in trace.prompt_ids if trace.text_of(t) not in ("<bos>", "<eos>"))
    return "".join(trace.text_of(t) for t in trace.prompt_ids)


def output_text(trace: Trace) -> str:
    sep = " " if trace.dag is not None else ""      # a DA-Transformer's tokens are words
    return sep.join(trace.text_of(t) for t in trace.output_ids)


def default_path(trace: Trace) -> Path:
    return Path(f"trace-{trace.method}.json")
