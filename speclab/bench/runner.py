"""`speclab bench`: every method (and peer) on every prompt, in one process, on the same models.

Warm-up first, then `repeats` passes; within a pass, prompts are the outer loop so that machine
noise hits all methods alike. A row per method: wall time (median over repeats of the summed
per-prompt wall time), tokens/s, speed-up over `ar`, tau, alpha, per-position acceptance, draft vs
verify time (from the pass whose wall time is the median), its guarantee, and for greedy runs the
share of outputs identical to `ar`.

Sampled (temperature > 0), every row runs each prompt with the same seeds (seed .. seed + seeds - 1,
DEFAULT_SEED where none is given). Every row gets quality columns (bench/quality.py): under greedy
its tokens against ar's, under sampling the TV of each round's first token against the target's p,
the target's NLL of the text, and distinct-n beside ar's.

The bench asks the Engine rows (decoding/engines.py), never an engine's name: the row that decodes
the target (`engine_for`) names the baseline (`ar` for a causal LM; for a masked-diffusion target
such as code-dllm `dllm-lowconf`, one token per step, or DiffusionGemma's own sampler), every
method's row must decode the target's kind, and a run's trace says through its Steps row whether it
verified drafts (alpha, per-position acceptance, draft / verify time, the cost model) and how many
steps it took (`steps`, counted as its engine counts them; `step`, what it calls one; `rate`, what
it calls tau). Only a causal target (the kind read from the model) gets the columns that re-read it
teacher-forced or against its weights' read: nll, the divergence diagnosis and the bandwidth limit.
On a diffusion target `--max-new-tokens` is the gen length and tau reads as tokens per forward.
"""
from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from speclab.bench.peers import PEERS, run_peer
from speclab import metrics
from speclab.bench import timing
from speclab.bench.quality import (greedy_columns, induced_tv, rule_of, sampling_columns, watching_roots)
from speclab.prompts import load_prompts
from speclab.params import parse_assignment
from speclab.decoding.drafters.lookup import SuffixHistory
from speclab.decoding.acceptance import Sampler
from speclab.decoding.engines import check_pairing, engine_for, get_engine
from speclab.decoding.registry import get_method, method_params
from speclab.decoding.rules import get_rule
from speclab.decoding.dgemma import is_dgemma
from speclab.models.loading import model_kind


DEFAULT_SEED = 0                   # the seed of a sampled bench run that names none (--seed)


@dataclass
class MethodSpec:
    label: str                     # what the report calls it, e.g. "draft-model" or "draft-model[k=6]"
    method: str
    params: dict = field(default_factory=dict)


def parse_methods(s: str) -> list[MethodSpec]:
    """'ar,draft-model[k=6],hf-assisted' -> specs (values are int, float, a JSON list or str); empty
    items (a trailing comma) are skipped. A spec is a name, then at most one [...] that closes at
    its end, its brackets balanced."""
    out = []
    for item in _split_top(s):
        name, params = item, {}
        if "[" in item or "]" in item:
            start = item.find("[")
            if start < 0 or _closing(item, start) != len(item) - 1:
                raise ValueError(f"bad method spec {item!r}: use name[param=value;param=value]")
            name, inner = item[:start], item[start + 1:-1]
            for kv in filter(str.strip, inner.split(";")):
                if "=" not in kv:
                    raise ValueError(f"bad method parameter {kv!r} in {item!r}: use param=value")
                try:
                    k, v = parse_assignment(kv)
                except ValueError as e:
                    raise ValueError(f"bad method parameter {kv!r} in {item!r}: {e}") from None
                params[k] = v
        name = name.strip()
        if not name or any(c in name for c in "=;"):
            raise ValueError(f"bad method spec {item!r}: start it with a method name, e.g. draft-model "
                             "or draft-model[k=6]")
        out.append(MethodSpec(item, name, params))
    return out


def _closing(item: str, start: int) -> int | None:
    """The index of the ] that closes the [ at `start` (None: it never closes)."""
    depth = 0
    for i in range(start, len(item)):
        depth += (item[i] == "[") - (item[i] == "]")
        if depth == 0:
            return i
    return None


def _split_top(s: str) -> list[str]:
    """Items at the top level of a comma-separated list (commas inside [...] stay); a ] with no [
    before it is an error, not a level below the top."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        depth += (ch == "[") - (ch == "]")
        if depth < 0:
            raise ValueError(f"bad method list {s!r}: a ] closes no [")
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return [p for p in parts if p]


def run_one(spec: MethodSpec, target, draft, prompt_ids, max_new_tokens, k, exit_layer, record, history=None,
            reference=None, cache_len=None, temperature: float = 0.0, seed=DEFAULT_SEED):
    """One method on one prompt (or, given a list of prompts, on them as one batch: a list of runs).
    `history`: the pass's SuffixHistory, for methods that take one; `reference`: ar's output on this
    prompt in this pass, for the oracle (which would otherwise decode it again); temperature and seed
    (a list of seeds for a batch, one per lane): the run's sampling (peers decode greedily).
    `rule.NAME=value` parameters of the spec are its acceptance rule's (rule_params)."""
    import speclab
    if spec.method in PEERS:
        r = run_peer(spec.method, target[0], target[1], prompt_ids, max_new_tokens,
                     draft=draft[0] if draft else None, k=spec.params.get("k", k),
                     exit_layer=spec.params.get("exit_layer", exit_layer), max_cache_len=cache_len)
        return dict(ids=r["ids"], wall_s=r["wall_s"], target_forwards=r["target_forwards"], draft_forwards=None,
                    drafted=None, accepted=None, draft_s=None, verify_s=None, rounds=None, trace=None)
    params = {k_: v for k_, v in spec.params.items() if not k_.startswith("rule.")}
    _, rule_params = rule_of(spec)
    if rule_params:
        params["rule_params"] = rule_params
    if history is not None and "history" in method_params(spec.method):
        params["history"] = history
    if reference is not None and "reference" in method_params(spec.method) and "reference" not in params:
        params["reference"] = reference
    if "record" in params:                      # per-method recording level, e.g. ar[record=none]
        record = None if params["record"] in ("none", None) else params.pop("record")
        params.pop("record", None)
    if "draft" in params:                       # a per-method draft, e.g. eagle[draft=DIR]
        draft = params.pop("draft")
    elif get_method(spec.method).draft_kind != "draft":
        draft = None                            # its head: the zoo's for this target (api.generate); none for dllm-*
    res = speclab.run(target, prompt_ids, spec.method, draft=draft, max_new_tokens=max_new_tokens, record=record,
                      dtype=next(target[0].parameters()).dtype, temperature=temperature, seed=seed,
                      **params)                 # dllm-*: max_new_tokens canvas slots
    if isinstance(res, list):                   # a batch: one run per lane
        return [_run(r, len(res)) for r in res]
    return _run(res, 1)


def _run(res, batch: int) -> dict:
    """A Result as a bench run. A lane of a batch shares the batch's wall time and verify forwards:
    its wall_s and verify_s are its 1/batch share (a pass's sums stay the real totals); latency_s is
    the whole batch's wall time (what its caller waited); draft_s is its own (lanes draft in turn).
    What was drafted, accepted and verified only where the trace's Steps row says its steps verify."""
    t = res.trace.totals
    run = dict(ids=res.ids, wall_s=t.wall_s / batch, latency_s=t.wall_s, target_forwards=t.target_forwards,
               trace=res.trace)
    if not res.trace.steps_row().verify:        # nothing drafted, nothing verified
        return run | dict(draft_forwards=None, drafted=None, accepted=None, draft_s=None, verify_s=None, rounds=None,
                          prefill_s=None)
    first = res.trace.rounds[0] if res.trace.rounds else None   # the prompt's forward and its first token
    return run | dict(draft_forwards=t.draft_forwards, drafted=t.drafted, accepted=t.accepted, draft_s=t.draft_s,
                      verify_s=t.verify_s / batch, rounds=[r for r in res.trace.rounds if r.drafted],
                      prefill_s=None if first is None else (first.verify_s + first.draft_s) / batch)


def set_name(prompt_set: str) -> str:
    """What the rows, the reports, the JSON and the traces folder call a prompt set: a shipped set
    its name, a JSONL file its stem (its path would turn DIR / name into that path)."""
    return Path(prompt_set).stem


def bench(target, draft, specs: list[MethodSpec], prompt_set: str, max_new_tokens: int = 128,
          repeats: int = 1, limit: int | None = None, k: int = 4, exit_layer: int = 4,
          record: str | None = "light", progress: bool = True, keep_traces: bool = False,
          vllm_python: str | None = None, batch_size: int = 1, thresholds: timing.Thresholds | None = None,
          temperature: float = 0.0, seed: int | None = None, seeds: int = 1) -> dict:
    """batch_size > 1: speclab's speculative methods decode the prompts batch_size at a time (one
    batch after another; throughput = new tokens / summed batch wall time); peers stay at batch 1.
    thresholds: where a speed-up's verdict turns unreliable (timing.Thresholds; None: the defaults).
    temperature > 0: every row samples, each prompt once per seed in seed, seed + 1, ...,
    seed + seeds - 1 (seed None: DEFAULT_SEED), the same seeds for every row; the passes run seed by
    seed (a seed's prompts together) and every per-prompt list holds one run per (seed, prompt).
    Quality columns (bench/quality.py): under greedy against ar token by token, under sampling the
    TV of each round's first token, the target's NLL of the text and distinct-n."""
    from tqdm.auto import tqdm
    model, tok = target
    seed_list = sampling_seeds(temperature, seed, seeds)
    if temperature > 0 and any(s.method in PEERS or s.method.startswith("vllm-") for s in specs):
        raise ValueError("the transformers and vLLM peers decode greedily: --temperature > 0 takes speclab's "
                         "methods only")
    prompts = load_prompts(prompt_set, limit)
    name = set_name(prompt_set)
    max_pos = getattr(model.config, "max_position_embeddings", None)
    from speclab.prompts import encode
    prompt_ids = [encode(tok, p, max_new_tokens, max_pos) for p in prompts]
    n = len(prompt_ids)
    jobs = [(ids, sd) for sd in seed_list for ids in prompt_ids]   # (prompt, seed), seed major
    # the baseline, always measured: the one the row that decodes this target names (ar for a causal LM)
    base = target_row(target, specs).baseline(model)
    causal = model_kind(target) == "causal"    # the target re-reads a text teacher-forced (nll, diagnosis)
    if any(s.method in PEERS and (s.method == "hf-diffusion") != is_dgemma(model) for s in specs):
        raise ValueError("hf-diffusion runs DiffusionGemma's generate(); the other hf-* peers decode causal LMs: "
                         "pick the peer that fits the target")
    if not any(s.label == base for s in specs):
        specs = [MethodSpec(base, base)] + specs
    from speclab.bench.vllm_peer import VLLM_PEERS, run_vllm_peer_passes
    vllm = [s for s in specs if s.method in VLLM_PEERS]
    # the baseline first in each prompt's turn: the oracle drafts its output
    ours = sorted((s for s in specs if s.method not in VLLM_PEERS), key=lambda s: s.label != base)
    batched = lambda s: batch_size > 1 and s.method not in PEERS and get_engine(get_method(s.method).engine).batch
    cache_len = max(map(len, prompt_ids)) + max_new_tokens   # hf-static's one cache: the longest request
    for s in ours:                                            # warm-up: every code path once
        run_one(s, target, draft, prompt_ids[:batch_size] if batched(s) else prompt_ids[0], 8, k, exit_layer, record,
                cache_len=cache_len, temperature=temperature,
                seed=[seed_list[0]] * len(prompt_ids[:batch_size]) if batched(s) else seed_list[0])
    runs = {s.label: [[None] * len(jobs) for _ in range(repeats)] for s in specs}
    for s in vllm:           # a whole set per peer in one vLLM process (its own warm-up, its own venv)
        dtype = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}[str(next(model.parameters()).dtype)[6:]]
        runs[s.label] = run_vllm_peer_passes(
            s.method, getattr(model, "name_or_path"), prompt_ids, max_new_tokens, dtype, s.params.get("k"),
            s.params.get("model") if s.method in ("vllm-eagle", "vllm-eagle3")
            else getattr(draft[0], "name_or_path", None) if draft else None, vllm_python, repeats=repeats)
        from speclab.bench.vllm_trace import vllm_trace   # each request as a summary trace
        for rep in runs[s.label]:
            for i, r in enumerate(rep):
                r["trace"] = vllm_trace(r["ids"], r["vllm"]["spec"], prompt_ids[i], tok, s.label,
                                        getattr(model, "name_or_path", "target"), r["wall_s"])
    specs = ours + vllm
    probe = None                            # the memory system's rates, sampled beside ar's own runs
    if causal and batch_size == 1 and hasattr(model, "get_input_embeddings"):
        from speclab.bench.bandwidth import BandwidthProbe
        p = next(model.parameters())
        probe = BandwidthProbe(p.device, p.dtype, model=model)
    # under sampling, the rows whose rule's first-token law is measured: each verify's root watched
    # in the first pass (a copy of p and q per round), its TV computed after the run, outside its timing
    guarantees = {s.label: row_guarantee(s) for s in specs}
    watched = {s.label: rule_of(s) for s in ours if temperature > 0 and not batched(s)
               and guarantees[s.label] == "lossy" and get_engine(get_method(s.method).engine).verify
               and get_rule(rule_of(s)[0]).induced is not None}
    sampler = Sampler(temperature)
    bar = tqdm(total=repeats * len(jobs) * len(ours), desc=f"bench {name}", disable=not progress)
    meter = timing.CpuMeter().start()       # other processes' share of the CPUs while the passes ran
    for rep in range(repeats):
        for b, sd in enumerate(seed_list):
            # suffix's history: this pass's earlier prompts under this method and seed, never the last
            # pass's nor another method's or seed's output for the same prompt
            history = {s.label: SuffixHistory() for s in specs}
            for i in range(b * n, (b + 1) * n, batch_size):
                chunk = [ids for ids, _ in jobs[i:min(i + batch_size, (b + 1) * n)]]
                for s in ours:
                    if batched(s):
                        runs[s.label][rep][i:i + len(chunk)] = run_one(
                            s, target, draft, chunk, max_new_tokens, k, exit_layer, record, history[s.label],
                            temperature=temperature, seed=[sd] * len(chunk))
                    for j, ids in enumerate(chunk if not batched(s) else []):
                        ar_run = runs[base][rep][i + j]
                        roots = []
                        with watching_roots(watched[s.label][0], roots) if rep == 0 and s.label in watched \
                                else contextlib.nullcontext():
                            r = run_one(s, target, draft, ids, max_new_tokens, k, exit_layer, record,
                                        history[s.label], ar_run and ar_run["ids"], cache_len, temperature, sd)
                        if rep == 0 and s.label in watched:
                            r["tv"] = induced_tv(*watched[s.label], roots, sampler, model)
                        runs[s.label][rep][i + j] = r
                        if probe is not None and s.label == base:   # the run and the stream right after it
                            probe.sample(ar_tokens_per_s=len(r["ids"]) / r["wall_s"])
                    bar.update(len(chunk))
    bar.close()
    busy = meter.busy()
    ar_wall = statistics.median(sum(r["wall_s"] for r in rep) for rep in runs[base])
    # identity is judged against ar on the same backend (backend=exact rows against ar[backend=exact])
    ref = {s.label: reference_label(s, specs, base) for s in specs}
    rows = [summarise(s, runs[s.label], [r["ids"] for r in runs[ref[s.label]][0]], ar_wall, name, k)
            for s in specs]
    for s, row in zip(specs, rows):
        row["batch_size"] = batch_size if batched(s) else 1
        row["guarantee"] = guarantees[s.label]
        if temperature > 0:      # the same seed draws differently under another method: no identity to count
            row["identical_rate"] = None
            sampling_columns(row, runs[s.label][0], runs[ref[s.label]][0], prompt_ids, seed_list, model,
                             guarantees[s.label], causal=causal)
        else:
            greedy_columns(row, [r["ids"] for r in runs[ref[s.label]][0]], [r["ids"] for r in runs[s.label][0]])
    # per-repeat speed-up ratios with their spread and verdict; the cost model of each median pass
    timing.annotate_bench_rows(rows, [s.label for s in specs], runs, base, busy, thresholds)
    if causal:
        for s, row in zip(specs, rows):
            row["identical_to"] = ref[s.label]
            if temperature > 0 or guarantees[s.label] == "lossy":
                # sampled texts, or a rule that changes the text by design: no arithmetic to diagnose
                row.update(dtype=str(next(model.parameters()).dtype).removeprefix("torch."), near_ties=None,
                           mismatches=None, divergences=None)
                continue
            explain_divergences(row, model, prompt_ids, [r["ids"] for r in runs[ref[s.label]][0]],
                                [r["ids"] for r in runs[s.label][0]], s.params.get("backend", "auto"),
                                other="hf" if s.method in PEERS or s.method.startswith("vllm-") else None)
    out = {"rows": rows, "baseline": base, "prompt_set": name, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
           "repeats": repeats, "batch_size": batch_size, "temperature": temperature,
           "seeds": seed_list if temperature > 0 else None}
    if probe is not None:                   # the samples only: the probe's buffers go with it
        out["bandwidth_samples"] = probe.summary()
    if keep_traces:
        out["traces"] = {s.label: [r["trace"] for r in runs[s.label][0]] for s in specs}
    return out


def target_row(target, specs: list[MethodSpec]):
    """The Engine row that decodes the bench's target (a name or (model, tokenizer)): its `baseline`
    names the method every row is divided by. One ValueError line, each from the rows, for a target
    whose engine names no baseline and for a method whose engine decodes another kind of model."""
    from speclab.bench.vllm_peer import VLLM_PEERS
    row = engine_for(target)
    if row.baseline is None:
        raise ValueError(f"the bench has no baseline for {row.kind_is} (the {row.name} engine names none): "
                         "bench a target another engine decodes")
    for s in specs:
        if s.method not in PEERS and s.method not in VLLM_PEERS:
            check_pairing(get_engine(get_method(s.method).engine), s.method, target)
    return row


def sampling_seeds(temperature: float, seed: int | None, seeds: int) -> list[int]:
    """The seeds every row runs each prompt with: [seed, ..., seed + seeds - 1] (seed None:
    DEFAULT_SEED). Greedy decoding draws nothing: one pass, and --seeds > 1 is refused."""
    if temperature < 0:
        raise ValueError(f"--temperature must be >= 0 (0 = greedy), got {temperature}")
    if not isinstance(seeds, int) or seeds < 1:
        raise ValueError(f"--seeds must be an integer >= 1, got {seeds}")
    if temperature == 0 and seeds > 1:
        raise ValueError(f"--seeds {seeds}: greedy decoding draws nothing; give --temperature > 0 to average "
                         "over seeds")
    base = DEFAULT_SEED if seed is None else seed
    return [base + j for j in range(seeds)]


def row_guarantee(spec: MethodSpec) -> str | None:
    """What a row's output is held to (decoding/guarantees.py) under its rule; None for a peer (another
    engine, held to nothing here; its identity with ar is measured)."""
    if spec.method in PEERS or spec.method.startswith("vllm-"):
        return None
    from speclab.decoding.registry import guarantee
    return guarantee(spec.method, rule_of(spec)[0])


def reference_label(spec: MethodSpec, specs: list[MethodSpec], base: str) -> str:
    """The baseline row a method's outputs are compared with: the baseline on the same backend if one ran."""
    backend = spec.params.get("backend")
    same = [s.label for s in specs if s.method == base and s.params.get("backend") == backend]
    return same[0] if backend and same else base


def explain_divergences(row: dict, model, prompt_ids, ar_ids, ids, backend: str = "auto", other: str | None = None):
    """For each prompt whose output differs from ar: the equality diagnostic's verdict (numerical
    near-tie or mismatch), so an identical_rate below 1 says why. A peer engine (other="hf") has
    arithmetic of its own: its divergences are judged against a second implementation's forwards."""
    from speclab.decoding.equality import diagnose
    verdicts = []
    for p, a, b in zip(prompt_ids, ar_ids, ids):
        d = diagnose(model, p, a, b, backend, other) if a != b else None
        if d is not None:
            verdicts.append(dict(position=d.position, verdict=d.verdict, margin=round(d.margin_one, 4),
                                 delta=round(d.delta, 4)))
    row["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    row["near_ties"] = sum(v["verdict"] == "numerical near-tie" for v in verdicts)
    row["mismatches"] = sum(v["verdict"] not in ("numerical near-tie",) for v in verdicts)
    row["divergences"] = verdicts


def steps_columns(traces: list) -> dict:
    """steps (summed over the runs, each counted as its engine counts them), step (what the engine
    calls one) and rate (what it calls new tokens per target forward), read from the traces' Steps
    row; None where a run left no trace (a transformers peer)."""
    if not traces or any(t is None for t in traces):
        return dict(steps=None, step=None, rate=None)
    row = traces[0].steps_row()
    return dict(steps=sum(t.steps_row().count(t) for t in traces), step=row.noun, rate=row.rate)


def summarise(spec: MethodSpec, reps, ar_ids, ar_wall, prompt_set, k) -> dict:
    first = reps[0]
    walls = [sum(r["wall_s"] for r in rep) for rep in reps]
    wall = statistics.median(walls)
    timed = reps[sorted(range(len(reps)), key=walls.__getitem__)[(len(reps) - 1) // 2]]  # the median pass
    new = sum(len(r["ids"]) for r in first)
    fwd = sum(r["target_forwards"] for r in first)
    row = dict(method=spec.label, prompt_set=prompt_set, wall_s=round(wall, 4),
               tokens_per_s=round(new / wall, 2) if wall else None,
               latency_s=round(statistics.mean(r.get("latency_s", r["wall_s"]) for r in timed), 4),  # per sequence
               speedup_vs_ar=round(ar_wall / wall, 3) if wall else None,
               tau=round(metrics.tau(new, fwd), 3) if fwd else None, new_tokens=new, target_forwards=fwd,
               identical_rate=sum(r["ids"] == a for r, a in zip(first, ar_ids)) / len(ar_ids))
    row.update(steps_columns([r.get("trace") for r in first]))
    # the tokens after the first, over the time after the prompt's forward: the decoding's own rate,
    # which the weights' read limit bounds (a prefill's many rows are arithmetic, not reading)
    if all(r.get("prefill_s") is not None for r in timed) and wall:
        pre = sum(r["prefill_s"] for r in timed)
        after = sum(len(r["ids"]) for r in timed) - len(timed)
        row.update(prefill_s=round(pre, 4),
                   decode_tokens_per_s=round(after / (wall - pre), 2) if wall > pre and after > 0 else None)
    if first[0]["drafted"] is not None:
        drafted, accepted = sum(r["drafted"] for r in first), sum(r["accepted"] for r in first)
        _, cond, unc = metrics.per_position([rnd for r in first for rnd in r["rounds"]])
        timed_s = lambda key: (round(sum(r[key] for r in timed), 4)       # same pass as the wall time
                               if all(r[key] is not None for r in timed) else None)  # vLLM: not reported
        row.update(alpha=round(metrics.alpha(accepted, drafted), 3) if drafted else None,
                   draft_forwards=sum(r["draft_forwards"] or 0 for r in first),
                   draft_s=timed_s("draft_s"), verify_s=timed_s("verify_s"),
                   accept_unconditional=[round(x, 3) for x in unc], accept_conditional=[round(x, 3) for x in cond])
    else:
        row.update(alpha=None, draft_forwards=None, draft_s=None, verify_s=None)
    return row
