"""Superposed Decoding beside ar: tokens per second of all k drafts and of the best one, and the
drafts' quality (each draft's NLL per token under the target, distinct-n), per prompt set.

`speclab bench` times and scores a method's output, one text a prompt; Superposed Decoding writes k
texts a forward, so this script runs the pair itself, interleaved prompt by prompt in one process
(ar, then superposed), and reads every draft from the trace (decoding.superposed.drafts).

    HF_HUB_OFFLINE=1 nice -n 19 .venv/bin/python scripts/superposed_bench.py --target smollm2-135m \\
        --prompts chat,code-edit --limit 20 --max-new-tokens 128 --dtype bf16 \\
        --json benchmarks/2026-11-29-superposed.json

Columns per set: ar_tok_s, best_tok_s (the output's tokens / decode seconds), all_tok_s (every
draft's tokens / the same seconds), speedup_best and speedup_all (over ar's tok/s), forwards_per_token
(ar: 1.00), identical_tokens (the best draft against ar, position by position), nll per token of ar
and of each draft rank (teacher-forced under the target, fp32 log-softmax), distinct_1/_2 of ar and
of the best draft (pooled over prompts), and cross_distinct_2 (distinct bigrams / all among a
prompt's k drafts, averaged: how much the drafts differ from each other). Decode seconds are the
traces' wall_s (the n-gram table is built and loaded before the first timed run).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

import speclab
from speclab.bench.quality import distinct_n, target_nll, token_agreement
from speclab.decoding.superposed import SuperposedConfig, drafts, ngram_table
from speclab.models.zoo import load_shared
from speclab.prompts import load_prompts


def one_set(model, tok, name: str, limit: int, max_new: int, params: dict) -> dict:
    prompts = load_prompts(name, limit)
    ar_s = sp_s = 0.0
    ar_ids, best, all_drafts, forwards = [], [], [], 0
    for p in prompts:
        chat = isinstance(p, dict)
        text = p["chat"] if chat else p
        a = speclab.run((model, tok), text, "ar", max_new_tokens=max_new, chat=chat, record=None)
        s = speclab.run((model, tok), text, "superposed", max_new_tokens=max_new, chat=chat, record=None, **params)
        ar_s += a.trace.totals.wall_s
        sp_s += s.trace.totals.wall_s
        forwards += s.trace.totals.target_forwards
        ar_ids.append((a.trace.prompt_ids, a.ids))
        best.append(s.ids)
        all_drafts.append((s.trace.prompt_ids, drafts(s)))
    n_ar = sum(len(i) for _, i in ar_ids)
    n_best = sum(len(b) for b in best)
    n_all = sum(len(d) for _, ds in all_drafts for d in ds)

    def nll(pairs):
        tot = [target_nll(model, pr, ids) for pr, ids in pairs]
        return round(sum(x for x, _ in tot) / max(1, sum(n for _, n in tot)), 4)
    k = max(len(ds) for _, ds in all_drafts)
    by_rank = [nll([(pr, ds[r]) for pr, ds in all_drafts if r < len(ds)]) for r in range(k)]
    cross = [distinct_n(ds, 2) for _, ds in all_drafts]
    return dict(prompts=len(prompts), ar_tokens=n_ar, best_tokens=n_best, all_tokens=n_all,
                ar_tok_s=round(n_ar / ar_s, 2), best_tok_s=round(n_best / sp_s, 2), all_tok_s=round(n_all / sp_s, 2),
                speedup_best=round(n_best / sp_s / (n_ar / ar_s), 3), speedup_all=round(n_all / sp_s / (n_ar / ar_s), 3),
                forwards_per_token=round(forwards / max(1, n_best), 3),
                **token_agreement([i for _, i in ar_ids], best),
                nll_ar=nll(ar_ids), nll_by_rank=by_rank,
                distinct_1_ar=distinct_n([i for _, i in ar_ids], 1), distinct_2_ar=distinct_n([i for _, i in ar_ids], 2),
                distinct_1_best=distinct_n(best, 1), distinct_2_best=distinct_n(best, 2),
                cross_distinct_2=round(statistics.mean(c for c in cross if c is not None), 4))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", default="chat,code-edit")
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--param", action="append", default=[], help="a superposed parameter, name=value")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    from speclab.params import parse_assignment
    params = dict(parse_assignment(x) for x in a.param)
    cfg = SuperposedConfig(**params).check()
    model, tok = load_shared(a.target, None, a.dtype)
    t0 = time.perf_counter()
    table = ngram_table(model, tok, cfg.self_text) if cfg.alpha > 0 else None
    print(f"n-gram table: {table.tokens if table else 0} tokens, {time.perf_counter() - t0:.1f} s", flush=True)
    speclab.run((model, tok), "Hello", "superposed", max_new_tokens=4, **params)        # warm up both paths
    speclab.run((model, tok), "Hello", "ar", max_new_tokens=4)
    out = dict(target=a.target, dtype=a.dtype, limit=a.limit, max_new_tokens=a.max_new_tokens,
               params=dict(vars(cfg), weights=list(cfg.weights)),
               machine=platform.processor() or platform.machine(), threads=torch.get_num_threads(),
               note="busy shared machine: ratios are from one process, prompt by prompt interleaved", sets={})
    for name in a.prompts.split(","):
        out["sets"][name] = one_set(model, tok, name, a.limit, a.max_new_tokens, params)
        print(name, json.dumps(out["sets"][name]), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
