"""tau, alpha and per-depth acceptance of smollm2-eagle (speclab's head) and an EAGLE-3 drafter on chat
prompts, every output checked against ar, in one process, bf16:

    python scripts/eagle3_eval.py DRAFTER_DIR N_PROMPTS NEW_TOKENS
"""
import sys, time, json, torch, speclab
from speclab.models import zoo
from speclab.models.eagle3 import load
from speclab.decoding.drafters.eagle3 import Eagle3Drafter, Eagle3ChainDrafter
from speclab.decoding.drafters.heads import EagleDrafter, EagleChainDrafter
try:
    from speclab.prompts import load_prompts
except ImportError:
    from speclab.bench.prompts import load_prompts
d3dir, n, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tgt = zoo.load_shared("smollm2-135m", dtype="bf16")
head = zoo.load_shared("smollm2-eagle", dtype="bf16")[0]
d3 = load(d3dir, dtype=torch.bfloat16)
items = load_prompts("chat", n)
methods = {"eagle (smollm2-eagle)": lambda: EagleDrafter(tgt[0], head),
           "eagle3": lambda: Eagle3Drafter(tgt[0], d3),
           "eagle-chain k=3 (smollm2-eagle)": lambda: EagleChainDrafter(tgt[0], head, k=3),
           "eagle3-chain k=3": lambda: Eagle3ChainDrafter(tgt[0], d3, k=3)}
agg = {m: dict(new=0, fwd=0, drafted=0, accepted=0, wall=0.0, same=True, pos=[0] * 4, reach=[0] * 4) for m in methods}
ar_wall = 0.0
for it in items:
    p = it["chat"] if isinstance(it, dict) else it
    t = time.time(); ref = speclab.generate(tgt, p, "ar", max_new_tokens=new, chat=True, record=None); ar_wall += time.time() - t
    for m, mk in methods.items():
        r = speclab.generate(tgt, p, mk(), max_new_tokens=new, chat=True)
        a, T = agg[m], r.trace.totals
        a["new"] += T.new_tokens; a["fwd"] += T.target_forwards; a["drafted"] += T.drafted; a["accepted"] += T.accepted
        a["wall"] += T.wall_s; a["same"] &= r.ids == ref.ids
        for rnd in r.trace.rounds:
            if rnd.drafted:
                acc = len(rnd.accepted)
                for j in range(4):
                    a["reach"][j] += 1
                    a["pos"][j] += acc > j
print(f"{len(items)} chat prompts x {new} new tokens, bf16; ar wall {ar_wall:.1f} s")
for m, a in agg.items():
    print(f"{m:34s} tau {a['new'] / a['fwd']:.3f}  alpha {a['accepted'] / max(a['drafted'], 1):.3f}  "
          f"accept@1..4 {[round(x / max(a['reach'][0], 1), 3) for x in a['pos']]}  wall {a['wall']:.1f} s  identical to ar: {a['same']}")
