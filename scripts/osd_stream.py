"""OSD against the frozen draft over a stream of prompts: acceptance as the online draft learns.

Each prompt is decoded by `draft-model` (the frozen draft) and by `osd` with one OnlineDrafts store
for the whole stream (what a server's session would own), greedily, same k; both are checked
against `ar` where --check is given. Prints per-prompt acceptance and a summary: acceptance
(accepted / drafted) over the stream and its first and last quarter, tokens per round, updates and
the seconds they took, wall time of each method.

    OMP_NUM_THREADS=1 python scripts/osd_stream.py --target smollm2-135m --draft smollm2-draft \
        --sets code-complete code-edit code-edit-long --new 40 --k 4
"""
from __future__ import annotations

import argparse
import json
import time

import speclab
from speclab.decoding.drafters.osd import POLICY, OnlineDrafts
from speclab.models.zoo import load
from speclab.prompts import encode, load_prompts


def stats(runs: list[dict]) -> dict:
    d, a, r = (sum(x[k] for x in runs) for k in ("drafted", "accepted", "rounds"))
    n = sum(x["new"] for x in runs)
    return dict(alpha=round(a / max(d, 1), 4), tokens_per_round=round(n / max(r, 1), 3), drafted=d, accepted=a)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="code-target")
    ap.add_argument("--draft", default="code-draft")
    ap.add_argument("--sets", nargs="+", default=["code-complete", "code-edit"])
    ap.add_argument("--limit", type=int, default=None, help="prompts in all (the first of the sets, in order)")
    ap.add_argument("--new", type=int, default=40)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--raw", action="store_true", help="chat questions as raw text (a model with no chat template)")
    ap.add_argument("--osd", default="{}", help="osd's parameters, JSON (e.g. '{\"lr\": 0.01}')")
    ap.add_argument("--check", action="store_true", help="also decode with ar and require identical outputs")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--json", default=None, help="write the per-prompt rows and the summary here")
    args = ap.parse_args()

    target, draft = load(args.target, device="cpu", dtype=args.dtype), load(args.draft, device="cpu", dtype=args.dtype)
    tok = target[1]
    items = [it for s in args.sets for it in load_prompts(s)][: args.limit]
    store, params = OnlineDrafts(), json.loads(args.osd)
    rows = []
    for i, it in enumerate(items):
        if args.raw and isinstance(it, dict):
            it = it["chat"]
        ids = encode(tok, it, args.new, getattr(target[0].config, "max_position_embeddings", None))
        row = dict(i=i, prompt_tokens=len(ids))
        outs = {}
        for method, kw in (("draft-model", {}), ("osd", dict(params, history=store))):
            r = speclab.run(target, ids, method, draft=draft, max_new_tokens=args.new, k=args.k, **kw)
            t = r.trace.totals
            ups = [d for rd in r.trace.rounds for d in rd.decisions if d.policy == POLICY]
            row[method] = dict(drafted=t.drafted, accepted=t.accepted, rounds=len(r.trace.rounds), new=t.new_tokens,
                               wall_s=round(t.wall_s, 4), draft_s=round(t.draft_s, 4),
                               updates=len(ups), update_s=round(sum(rd.info.get("update_s", 0.0) for rd in r.trace.rounds), 4),
                               version=r.trace.rounds[-1].info.get("draft_version"),
                               loss=[(u.inputs["loss_before"], u.inputs["loss_after"]) for u in ups])
            outs[method] = r.ids
        if args.check:
            ref = speclab.run(target, ids, "ar", max_new_tokens=args.new, record=None).ids
            row["identical"] = all(o == ref for o in outs.values())
            assert row["identical"], f"prompt {i}: a method diverged from ar"
        rows.append(row)
        f, o = row["draft-model"], row["osd"]
        print(f"{i:3d} frozen {f['accepted']:3d}/{f['drafted']:3d}  osd {o['accepted']:3d}/{o['drafted']:3d}  "
              f"v{o['version']} updates {o['updates']} ({o['update_s']:.2f}s) {o['loss']}", flush=True)
    q = max(1, len(rows) // 4)
    summary = {}
    for m in ("draft-model", "osd"):
        runs = [r[m] for r in rows]
        summary[m] = dict(all=stats(runs), first_quarter=stats(runs[:q]), last_quarter=stats(runs[-q:]),
                          wall_s=round(sum(x["wall_s"] for x in runs), 2), draft_s=round(sum(x["draft_s"] for x in runs), 2))
    o = [r["osd"] for r in rows]
    summary["osd"] |= dict(updates=sum(x["updates"] for x in o), update_s=round(sum(x["update_s"] for x in o), 3),
                           version=o[-1]["version"], params=params)
    summary["setup"] = dict(target=args.target, draft=args.draft, sets=args.sets, prompts=len(rows), new=args.new, k=args.k)
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(rows=rows, summary=summary), fh)


if __name__ == "__main__":
    main()
