"""SpecKV's length model, fit on the draft's features and the target's verdicts from real runs:

    speclab train speckv --target smollm2-135m --draft smollm2-draft --out speclab-zoo/speclab_zoo/smollm2-speckv

collect   greedy speculative runs with a fixed draft length G over the seed questions (chat
          template) and stdlib prefixes (none of them a bench prompt): per round the draft's
          confidence and entropy at its first draft position and the accepted length a (0..G).
          Under greedy a shorter chain is a prefix of this one, so a row labels every gamma:
          the first j are all accepted iff a >= j
cost      one more draft token's price in ar steps: (round seconds / ar step seconds - 1) / G, from
          the same runs and ar on the first prompts
fit       LengthModel (drafters/speckv.py): binary cross-entropy of each P_j against 1[a >= j],
          full batch, Adam, features standardised
report    on held-out rows, the tokens per cost the model's gamma realises (1 + min(a, gamma)) /
          (1 + gamma cost) against every fixed gamma's: the model ships as the method's default
          only where it beats the best fixed gamma (docs/methods.md says which)
"""
from __future__ import annotations

import argparse
import json
import random
import time

import torch

from speclab.decoding.drafters.model import DraftModelDrafter
from speclab.decoding.drafters.speckv import LengthModel, SpecKVDrafter, save_model


class Collector(SpecKVDrafter):
    """SpecKV's drafter at a fixed length G, keeping (confidence, entropy, accepted) per round."""

    def __init__(self, draft, G: int):
        DraftModelDrafter.__init__(self, draft, "auto", k=G, max_k=G)
        self.G, self.cost, self.level, self.rows = G, 0.0, "", []

    def choose(self, logits):
        q = logits.float().softmax(-1)
        c, H = float(q.max()), float(-(q * q.clamp_min(1e-30).log()).sum())
        return self.G, c, H, [0.0] * self.G

    def observe(self, out):
        super().observe(out)
        self.rows.append((self.c, self.H, len(out.path)))


def realised(rows, gammas: list[int], cost: float) -> float:
    """Tokens per cost over rows (c, H, a) when each is drafted at its gamma: a ratio of sums."""
    tokens = sum(1 + min(a, g) for (_, _, a), g in zip(rows, gammas))
    return tokens / sum(1 + g * cost for g in gammas)


def fit(rows, G: int, steps: int, lr: float, seed: int) -> LengthModel:
    torch.manual_seed(seed)
    x = torch.tensor([[c, h] for c, h, _ in rows])
    y = torch.tensor([[float(a >= j) for j in range(1, G + 1)] for _, _, a in rows])
    model = LengthModel(G)
    model.mean.copy_(x.mean(0))
    model.std.copy_(x.std(0).clamp_min(1e-6))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model.logits(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


# flag, type, default, help
OPTIONS = (("--target", str, "smollm2-135m", "the target (a zoo name or a directory)"),
           ("--draft", str, "smollm2-draft", "the draft model it speculates with"),
           ("--dtype", str, "auto", "auto, bf16 or fp32"),
           ("--G", int, 8, "the longest draft the model predicts for (the runs draft this many)"),
           ("--chat", int, 24, "seed questions the target answers"),
           ("--code", int, 24, "stdlib prefixes the target continues"),
           ("--max-new", int, 96, "tokens a run writes per prompt"),
           ("--ar-prompts", int, 6, "prompts ar runs on for the cost's ar step"),
           ("--steps", int, 3000, "full-batch Adam steps"),
           ("--lr", float, 0.01, "Adam's learning rate"),
           ("--held-frac", float, 0.2, "rounds held out for the report"),
           ("--seed", int, 0, "the split's and the fit's seed"))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="speclab train speckv", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the model's directory (speckv.json, speckv.safetensors)")
    for flag, kind, default, what in OPTIONS:
        ap.add_argument(flag, type=kind, default=default, help=what)
    a = ap.parse_args(argv)
    import speclab
    from speclab.train.specdecpp import prompts_for
    target = speclab.load(a.target, dtype=a.dtype)
    draft = speclab.load(a.draft, dtype=next(target[0].parameters()).dtype)
    prompts = prompts_for(target[1], a.chat, a.code, a.seed)
    collector, t0 = Collector(draft[0], a.G), time.time()
    wall, rounds = 0.0, 0
    for i, p in enumerate(prompts):
        r = speclab.generate(target, p, collector, max_new_tokens=a.max_new, record=None)
        wall, rounds = wall + r.trace.totals.wall_s, rounds + r.trace.totals.target_forwards
        print(f"collect: {i + 1}/{len(prompts)} prompts, {len(collector.rows)} rounds, {time.time() - t0:.0f} s",
              flush=True)
    ar_wall, ar_steps = 0.0, 0
    for p in prompts[:a.ar_prompts]:
        r = speclab.generate(target, p, "ar", max_new_tokens=a.max_new, record=None)
        ar_wall, ar_steps = ar_wall + r.trace.totals.wall_s, ar_steps + r.trace.totals.target_forwards
    cost = max(0.0, (wall / rounds) / (ar_wall / ar_steps) - 1.0) / a.G
    rows = list(collector.rows)
    random.Random(a.seed).shuffle(rows)
    n_held = max(1, round(len(rows) * a.held_frac))
    held, train = rows[:n_held], rows[n_held:]
    model = fit(train, a.G, a.steps, a.lr, a.seed)
    with torch.no_grad():
        P = model(torch.tensor([[c, h] for c, h, _ in held])).tolist()
    from speclab.decoding.drafters.speckv import tokens_per_cost
    chosen = [1 + max(range(a.G), key=tokens_per_cost(p, cost).__getitem__) for p in P]
    fixed = {g: round(realised(held, [g] * len(held), cost), 4) for g in range(1, a.G + 1)}
    report = dict(rows=len(rows), held=len(held), cost=round(cost, 4), mean_accepted=round(
        sum(r[2] for r in rows) / len(rows), 3), model=round(realised(held, chosen, cost), 4), fixed=fixed,
        chosen={g: chosen.count(g) for g in sorted(set(chosen))})
    print(json.dumps(report, indent=1))
    save_model(model, a.out, {"draft": a.draft, "target": a.target, "cost": report["cost"],
                              "level": str(next(target[0].parameters()).dtype).removeprefix("torch."),
                              "held_out": report})
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
