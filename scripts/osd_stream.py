"""OSD against the frozen draft over a stream of prompts: acceptance as the online draft learns.

Each prompt is decoded by `draft-model` (the frozen draft) and by `osd` once per variant (what is
trained, `--train`, times the loss, `--loss`), each variant with its own OnlineDrafts store for the
whole stream (what a server's session would own), greedily, same k; all are checked against `ar`
where --check is given. Prints per-prompt acceptance and a summary per method: acceptance (accepted /
drafted) over the stream, its first and last quarter and each block of --block prompts (so one sees
whether it rises), tokens per round, updates and the seconds they took, wall time.

    OMP_NUM_THREADS=1 python scripts/osd_stream.py --target smollm2-135m --draft smollm2-draft \
        --sets code-edit code-complete code-mixed --limit 100 --new 32 --k 4 \
        --variants head:kl all:kl all:jsd --all '{"lr": 1e-4, "steps": 4, "interval": 16, "buffer": 16}'
"""
from __future__ import annotations

import argparse
import json

import speclab
from speclab.decoding.drafters.osd import LOSSES, POLICY, TRAIN, OnlineDrafts
from speclab.models.zoo import load
from speclab.prompts import encode, load_prompts

FROZEN = "draft-model"


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
    ap.add_argument("--train", nargs="+", default=["head"], choices=TRAIN, help="what osd trains, one variant each")
    ap.add_argument("--loss", nargs="+", default=["kl"], choices=LOSSES, help="osd's loss, one variant each")
    ap.add_argument("--variants", nargs="+", default=None, metavar="TRAIN:LOSS",
                    help="the osd variants instead of every --train with every --loss (e.g. head:kl all:jsd)")
    ap.add_argument("--osd", default="{}", help="every variant's osd parameters, JSON (e.g. '{\"beta\": 0.9}')")
    ap.add_argument("--head", default="{}", help="train=head variants' parameters, JSON (over --osd)")
    ap.add_argument("--all", default="{}", help="train=all variants' parameters, JSON (over --osd)")
    ap.add_argument("--block", type=int, default=10, help="prompts per block in the per-block acceptance")
    ap.add_argument("--check", action="store_true", help="also decode with ar and require identical outputs")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--json", default=None, help="write the per-prompt rows and the summary here")
    args = ap.parse_args()

    target, draft = load(args.target, device="cpu", dtype=args.dtype), load(args.draft, device="cpu", dtype=args.dtype)
    tok = target[1]
    items = [it for s in args.sets for it in load_prompts(s)][: args.limit]
    base = json.loads(args.osd)
    per = {"head": json.loads(args.head), "all": json.loads(args.all)}
    pairs = [v.split(":") for v in args.variants] if args.variants else [(t, lo) for t in args.train for lo in args.loss]
    if any(len(p) != 2 or p[0] not in TRAIN or p[1] not in LOSSES for p in pairs):
        ap.error(f"--variants: each is TRAIN:LOSS, TRAIN one of {', '.join(TRAIN)}, LOSS one of {', '.join(LOSSES)}")
    variants = {f"osd[train={t},loss={lo}]": base | per[t] | dict(train=t, loss=lo) for t, lo in pairs}
    stores = {name: OnlineDrafts() for name in variants}
    methods = [FROZEN, *variants]
    rows = []
    for i, it in enumerate(items):
        if args.raw and isinstance(it, dict):
            it = it["chat"]
        ids = encode(tok, it, args.new, getattr(target[0].config, "max_position_embeddings", None))
        row = dict(i=i, prompt_tokens=len(ids))
        outs = {}
        for method in methods:
            name, kw = ("osd", dict(variants[method], history=stores[method])) if method in variants else (method, {})
            r = speclab.run(target, ids, name, draft=draft, max_new_tokens=args.new, k=args.k, **kw)
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
        print(f"{i:3d} " + "  ".join(f"{m}: {row[m]['accepted']}/{row[m]['drafted']}"
                                     + (f" v{row[m]['version']}" if m in variants else "") for m in methods), flush=True)
        summary = summarise(rows, methods, variants, args)
        if args.json:               # after every prompt: a run stopped early still leaves its rows
            with open(args.json, "w") as fh:
                json.dump(dict(rows=rows, summary=summary), fh)
    print(json.dumps(summary, indent=1))


def summarise(rows: list[dict], methods: list[str], variants: dict, args) -> dict:
    q, b = max(1, len(rows) // 4), max(1, args.block)
    summary = {}
    for m in methods:
        runs = [r[m] for r in rows]
        summary[m] = dict(all=stats(runs), first_quarter=stats(runs[:q]), last_quarter=stats(runs[-q:]),
                          blocks=[stats(runs[j:j + b])["alpha"] for j in range(0, len(runs), b)],
                          wall_s=round(sum(x["wall_s"] for x in runs), 2), draft_s=round(sum(x["draft_s"] for x in runs), 2))
        if m in variants:
            summary[m] |= dict(updates=sum(x["updates"] for x in runs), update_s=round(sum(x["update_s"] for x in runs), 3),
                               version=runs[-1]["version"], params=variants[m])
    summary["setup"] = dict(target=args.target, draft=args.draft, sets=args.sets, prompts=len(rows), new=args.new,
                            k=args.k, block=b, dtype=args.dtype)
    return summary


if __name__ == "__main__":
    main()
