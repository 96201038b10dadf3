"""`speclab bench ...`: argument parsing and output for the bench runner."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from speclab.bench.timing import MAX_BUSY, MAX_DISAGREE
from speclab.bench.whatif import forward_costs, ideal_speedup, whatif_table


def add_bench(sub):
    p = sub.add_parser("bench", help="measure methods and transformers peers side by side",
                       description="Every method on every prompt in one process, warm-up first. "
                                   "Methods: comma-separated, with parameters as name[k=6;threshold=0.5], an "
                                   "acceptance rule as name[rule=typical;rule.eps=0.1]; "
                                   "peers: hf-greedy, hf-static, hf-assisted, hf-prompt-lookup, hf-early-exit; "
                                   "vllm-greedy, vllm-ngram, vllm-suffix, vllm-draft, vllm-eagle[model=DIR], vllm-eagle3[model=DIR] "
                                   "(in vLLM's own venv: make vllm).")
    p.add_argument("--target", default="code-target")
    p.add_argument("--draft", default=None)
    p.add_argument("--methods", default="ar,draft-model,prompt-lookup")
    p.add_argument("--prompts", default="code-complete",
                   help="code-complete | code-edit | code-mixed | chat | a JSONL file; several: comma-separated")
    p.add_argument("--categories", nargs="?", const="all", metavar="NAMES",
                   help="instead of --prompts: the task categories (speclab/bench/categories.py), all or a "
                        "comma-separated subset, reported per category and method")
    p.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                   help="for speclab's methods and the transformers peers alike (auto: bf16 on native-bf16 hardware)")
    p.add_argument("--limit", type=int, help="use only the first N prompts")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sample at temperature T (default 0: greedy). Every row then runs each prompt with the same "
                        "seeds, and the quality columns turn from token identity with ar to the TV of each round's "
                        "first token, the target's NLL of the text and distinct-1/2 (docs/performance.md)")
    p.add_argument("--seed", type=int, default=None, metavar="S",
                   help="the first seed of a sampled bench (default 0: a sampled bench is reproducible without one)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="sample every prompt with N seeds, S .. S+N-1, the quality columns averaged over them "
                        "(default 1; greedy takes 1)")
    p.add_argument("--max-disagree", type=float, default=MAX_DISAGREE, metavar="SHARE",
                   help="a speed-up is unreliable where a repeat's ratio lies further than this share from "
                        "their median (default %(default)s: 10%%)")
    p.add_argument("--max-busy", type=float, default=MAX_BUSY, metavar="SHARE",
                   help="... or where other processes used more than this share of all CPUs during the runs "
                        "(default %(default)s: 25%%)")
    p.add_argument("--k", type=int, default=4, help="draft length for draft-model, layer-skip and the transformers peers "
                        "(prompt-lookup keeps its own: k=5, 11 after a fully accepted draft; give prompt-lookup[k=N])")
    p.add_argument("--exit-layer", type=int, default=4, help="exit layer for hf-early-exit")
    p.add_argument("--record", choices=["none", "light", "full"], default="light")
    p.add_argument("--batch-size", type=int, default=1, metavar="B",
                   help="speclab's methods decode the prompts B at a time (one target forward per round for the "
                        "batch); tokens_per_s is then the batch throughput, latency_s the wait per sequence")
    p.add_argument("--whatif", action="store_true", help="what-if tau(k) and efficiency for draft-model")
    p.add_argument("--json", dest="json_out")
    p.add_argument("--traces", metavar="DIR", help="save each run's trace (first pass) as DIR/<set>/<method>/<i>.json "
                   "(a JSONL file's set: its stem; with --seeds N, i runs over seeds, then prompts); "
                   "vLLM peers as summary traces of their per-request metrics")
    p.add_argument("--html")
    p.add_argument("--device")
    p.add_argument("--vllm-python", help="the interpreter of vLLM's venv for vllm-* peers (default .venv-vllm; `make vllm`)")
    p.set_defaults(func=cmd_bench)


def cmd_bench(a):
    from speclab.api import as_model, check_vocab
    from speclab.bench.report import html
    from speclab.bench.runner import bench, parse_methods
    specs = parse_methods(a.methods)
    from speclab.bench.peers import PEERS as HF_PEERS
    from speclab.bench.vllm_peer import VLLM_PEERS, find_vllm_python, vllm_eagle3_dir, vllm_eagle_dir
    from speclab.decoding.engines import get_engine
    from speclab.decoding.registry import get_method
    PEERS = HF_PEERS + VLLM_PEERS
    if any(s.method in VLLM_PEERS for s in specs):
        find_vllm_python(a.vllm_python)              # one line saying `make vllm` before any model loads
    from speclab.bench.runner import rule_of, sampling_seeds
    sampling_seeds(a.temperature, a.seed, a.seeds)   # a bad temperature or seed count: one line, before any load
    if a.temperature > 0 and any(s.method in PEERS for s in specs):
        raise ValueError("the transformers and vLLM peers decode greedily: --temperature > 0 takes speclab's "
                         "methods only")
    for s in specs:
        if s.method == "vllm-eagle":                 # a head vLLM cannot load fails before any model loads
            vllm_eagle_dir(s.params.get("model"))
        if s.method == "vllm-eagle3":
            vllm_eagle3_dir(s.params.get("model"))
        if s.method not in PEERS:
            m = get_method(s.method)                 # unknown names fail before any model loads
            row = get_engine(m.engine)               # and so do the method's parameters (its row's check)
            row.check_method(m, {k: v for k, v in s.params.items() if k != "rule" and not k.startswith("rule.")})
            if row.verify:                           # and a rule that cannot serve the run: its one line
                from speclab.decoding.rules import check_run, rule_params
                rule, params = rule_of(s)
                rule_params(rule, params)
                check_run(rule, a.temperature == 0, method=s.method)
        if s.method not in PEERS and "k" not in s.params and s.method in ("draft-model", "layer-skip"):
            s.params["k"] = a.k
    if a.repeats < 1 or a.max_new_tokens < 1:
        raise ValueError("--repeats and --max-new-tokens must be >= 1")
    from speclab.bench.timing import Thresholds
    try:
        thresholds = Thresholds(a.max_disagree, a.max_busy)
    except ValueError as e:                          # name the flag, not the field
        raise ValueError(str(e).replace("max_disagree", "--max-disagree").replace("max_busy", "--max-busy")) from None
    if a.batch_size < 1:
        raise ValueError(f"--batch-size must be an integer >= 1, got {a.batch_size}")
    if a.batch_size > 1:
        from speclab.decoding.batch import unsupported
        for s in specs:
            if s.method not in PEERS and unsupported(s.method):
                raise ValueError(f"--batch-size {a.batch_size}: {unsupported(s.method)}")
    from speclab.bench.runner import target_row
    from speclab.models.loading import model_kind
    if model_kind(a.target) is not None:             # a hub id's kind is known once loaded: bench() checks it then
        target_row(a.target, specs)                  # a target with no baseline, a method of another kind
    sets = [s.strip() for s in a.prompts.split(",") if s.strip()]
    if a.categories:
        from speclab.bench.categories import category_sets
        sets = category_sets(a.categories)
    check_before_run(a, sets)                        # before any model loads: no run's minutes are lost to a typo
    target = as_model(a.target, a.device, a.dtype)
    draft = as_model(a.draft, a.device, a.dtype) if a.draft else None
    if draft is not None:
        check_vocab(target, draft)
    record = None if a.record == "none" else a.record
    results, traces = [], {}                         # traces: set name -> label -> [Trace per prompt]
    for prompt_set in sets:
        x = bench(target, draft, specs, prompt_set, a.max_new_tokens, a.repeats, a.limit, a.k, a.exit_layer, record,
                  keep_traces=a.whatif or bool(a.traces) or bool(a.categories), vllm_python=a.vllm_python,
                  batch_size=a.batch_size, thresholds=thresholds, temperature=a.temperature, seed=a.seed, seeds=a.seeds)
        if "traces" in x:
            traces[x["prompt_set"]] = x.pop("traces")  # saved after the results: not part of the JSON report
        results.append(x)
    measured = {x["prompt_set"]: x.pop("bandwidth_samples") for x in results if "bandwidth_samples" in x}
    res = results[0] if len(results) == 1 else dict(results[0], rows=[r for x in results for r in x["rows"]],
                                                    prompt_set=",".join(x["prompt_set"] for x in results))
    res["dtype"] = str(next(target[0].parameters()).dtype).removeprefix("torch.")
    if a.categories:
        from speclab.bench.categories import category_rows
        res["categories"] = category_rows(results, traces)
    if next(target[0].parameters()).device.type == "cpu":      # which kernel path made these numbers, and why
        from speclab.models import kernels
        res["kernel"] = {k: v for k, v in kernels.info().items() if k in ("path", "why", "cpu", "flags")}
    res["verdict_thresholds"] = {"max_disagree": thresholds.max_disagree, "max_busy": thresholds.max_busy}
    if a.batch_size == 1:           # both measure against batch-1 forwards
        add_efficiency(res, target[0], draft[0] if draft else None, a.k)
        add_bandwidth(res, target[0], measured)
        if any(s.method not in PEERS and get_method(s.method).tree for s in specs):   # budget = a verify's rows
            from speclab.bench.whatif import verify_costs
            res["verify_cost"] = verify_costs(target[0])
    if a.whatif:
        # one fixed-k, recorded draft-model run (the first set's): mixing length policies would blur "tau at k"
        fixed = [s for s in specs if s.method == "draft-model" and set(s.params) <= {"k"}]
        recorded = traces[results[0]["prompt_set"]][fixed[0].label] if fixed and record else []
        res["whatif"] = whatif_table(recorded) if recorded else []
        res["whatif_from"] = fixed[0].label if recorded else None
    # the results first: whatever fails after them (a report, a trace, a plot) leaves them on disk
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(res, f, indent=1)
    try:
        print_report(res)
        if "categories" in res:
            from speclab.bench.categories import print_categories
            print_categories(res["categories"])
        for name, ts in traces.items() if a.traces else ():
            save_traces(ts, Path(a.traces) / name)
        if a.html:
            html(res, a.html)
    except BaseException:
        if a.json_out:
            print(f"speclab: bench: the results are saved in {a.json_out}; what came after them failed:",
                  file=sys.stderr)
        raise
    return 0


def check_before_run(a, sets: list[str]):
    """One ValueError line, before the run, for what would otherwise fail after a set's minutes of
    measurement: a prompt set that does not load, two sets of one name (their traces and bandwidth
    rows would overwrite each other), an output in a missing folder."""
    from speclab.bench.runner import set_name
    from speclab.prompts import load_prompts
    for s in sets:
        load_prompts(s)
    names = [set_name(s) for s in sets]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--prompts: two prompt sets are named {twice[0]!r} (a file's name is its stem): rename one")
    for flag, path in (("--json", a.json_out), ("--html", a.html)):
        if path and not Path(path).absolute().parent.is_dir():
            raise ValueError(f"{flag} {path}: no folder {Path(path).absolute().parent}")
    if a.traces and Path(a.traces).exists() and not Path(a.traces).is_dir():
        raise ValueError(f"--traces {a.traces} is a file: give a folder")


def print_report(res: dict):
    """The results on stdout: the table, the spread of each speed-up, and the measured limits."""
    from speclab.bench.report import markdown
    from speclab.bench.timing import print_spread
    if "kernel" in res:
        k = res["kernel"]
        print(f"kernel {k['path']} ({k['why']}; CPU {k['cpu']})")
    print(markdown(res))
    print_spread(res)
    for r in res["rows"] if res["batch_size"] > 1 else []:
        print(f"batch {r['batch_size']:>3}  {r['method']:<24} {r['tokens_per_s']} tok/s over the batch, "
              f"{r['latency_s']} s per sequence")
    for name, b in res.get("bandwidth", {}).get("per_set", {}).items():
        lo, hi = b["bandwidth_range_gb_s"]
        print(f"ar against the bandwidth limit ({res['dtype']}, {name}): {b['weight_mb_per_token']} MB of weights per "
              f"token; {b.get('bandwidth_kind', 'streaming read')} {b['bandwidth_gb_s']} GB/s (median of {b['samples']} samples beside ar's runs, "
              f"{lo}-{hi}) -> limit {b['limit_tokens_per_s']} tok/s, ar ({b['ar_tokens_per_s']} tok/s) at "
              f"{b['ar_share_of_limit']:.2f} of it; the {res['dtype']} GEMV ({b['gemv_kernel']}) reads {b['gemv_gb_s']} "
              f"GB/s -> {b['gemv_limit_tokens_per_s']} tok/s, ar at {b['ar_share_of_gemv_limit']:.2f}")
        if "ar_decode_share_of_limit" in b:
            print(f"  after the prompts' prefill ({b['ar_prefill_share']:.0%} of ar's time, arithmetic more than reading): "
                  f"ar decodes {b['ar_decode_tokens_per_s']} tok/s, {b['ar_decode_share_of_limit']:.2f} of the limit")
        if "ar_share_paired" in b:
            p = b["ar_share_paired"]
            print(f"  prompt by prompt (each ar run against the stream sampled right after it): median "
                  f"{p['median']:.2f} of the limit ({p['min']:.2f}-{p['max']:.2f}, {p['prompts']} prompts)")
        if "own_read_gb_s" in b:
            lo, hi = b["own_range_gb_s"]
            p = b.get("ar_share_of_own_read_paired")
            print(f"  against reading its own packed weights (the same bytes, wherever they live): {b['own_read_gb_s']} "
                  f"GB/s ({lo}-{hi}) -> limit {b['own_limit_tokens_per_s']} tok/s, ar at {b['ar_share_of_own_read']:.2f}"
                  + (f"; prompt by prompt median {p['median']:.2f} ({p['min']:.2f}-{p['max']:.2f})" if p else ""))
    for k_, c in res.get("forward_costs", {}).items():
        print(f"bare forward ms (k={k_}): target(1) {c['c_target1']}, verify(k+1) {c['c_verify']}, draft {c.get('c_draft')}")
    if "verify_cost" in res:
        print("verify forward of T rows / one-token forward: " +
              ", ".join(f"T={T} {c:.2f}" for T, c in res["verify_cost"].items()))
    for w in res.get("whatif", []):
        print(f"what-if k={w['k']} threshold={w['threshold']}: tau {w['tau']}")


def add_bandwidth(res: dict, target_model, measured: dict):
    """ar's tokens/s against the memory-bandwidth limit of batch-1 decoding, measured in this process:
    per prompt set against the bandwidth sampled beside that set's ar runs (measured: set -> a
    BandwidthProbe summary), the headline the best set's share."""
    from speclab.bench.bandwidth import bandwidth_limit, paired_share, weight_bytes_per_token
    ar = {r["prompt_set"]: r for r in res["rows"] if r["method"] == "ar" and r.get("tokens_per_s")}
    if not ar or not hasattr(target_model, "get_input_embeddings"):
        return
    per_set = {}
    for name, row in ar.items():
        b = bandwidth_limit(target_model, measured.get(name))
        b["ar_tokens_per_s"] = row["tokens_per_s"]
        b["ar_share_of_limit"] = round(row["tokens_per_s"] / b["limit_tokens_per_s"], 3)
        b["ar_share_of_gemv_limit"] = round(row["tokens_per_s"] / b["gemv_limit_tokens_per_s"], 3)
        if row.get("decode_tokens_per_s"):         # the same runs without their prompts' prefill
            b["ar_decode_tokens_per_s"] = row["decode_tokens_per_s"]
            b["ar_decode_share_of_limit"] = round(row["decode_tokens_per_s"] / b["limit_tokens_per_s"], 3)
            b["ar_prefill_share"] = round(row["prefill_s"] / row["wall_s"], 3)
        pairs = (measured.get(name) or {}).get("pairs")
        if pairs:
            b["ar_share_paired"] = paired_share(pairs, weight_bytes_per_token(target_model))
        if "own_limit_tokens_per_s" in b:
            b["ar_share_of_own_read"] = round(row["tokens_per_s"] / b["own_limit_tokens_per_s"], 3)
            if measured[name].get("own_pairs"):
                b["ar_share_of_own_read_paired"] = paired_share(measured[name]["own_pairs"],
                                                                weight_bytes_per_token(target_model))
        per_set[name] = b
    best = max(per_set, key=lambda n: per_set[n]["ar_share_of_limit"])
    res["bandwidth"] = dict(per_set[best], prompt_set=best, per_set=per_set)


def save_traces(traces: dict, where: Path):
    """label -> [Trace or None per prompt] as where/<label>/<i>.json (peers without traces skipped)."""
    import re
    for label, ts in traces.items():
        for i, t in enumerate(ts):
            if t is not None:
                d = where / re.sub(r"[^\w.=-]+", "_", label)
                d.mkdir(parents=True, exist_ok=True)
                t.save(d / f"{i:03d}.json")


def add_efficiency(res: dict, target_model, draft_model, k: int):
    """efficiency = measured speed-up / ideal, for draft-model rows with a fixed k.

    The ideal uses bare forward costs measured alone (speclab.bench.whatif.forward_costs), so
    efficiency < 1 is exactly the loop's own overhead: drafting logic, acceptance, cache edits.
    """
    rows = [r for r in res["rows"] if r["method"].startswith("draft-model") and r.get("draft_forwards")]
    if not rows or draft_model is None:
        return
    costs = {}
    for r in rows:
        kk = round(r["draft_forwards"] / r["target_forwards"])       # draft forwards per round
        if kk not in costs:
            costs[kk] = forward_costs(target_model, draft_model, max(kk, 1))
        c = costs[kk]
        ideal = ideal_speedup(r["tau"], kk, c["c_draft"], c["c_target1"], c["c_verify"])
        r["ideal_speedup"] = round(ideal, 3)
        r["efficiency"] = round(r["speedup_vs_ar"] / ideal, 3) if ideal else None
    res["forward_costs"] = {str(k_): {n: (round(v * 1000, 3) if n != "k" else v) for n, v in c.items()}
                            for k_, c in costs.items()}    # milliseconds
