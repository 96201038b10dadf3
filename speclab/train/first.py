"""FiRST's routers, fit on labels the target computes for itself:

    speclab train first --target code-target --out speclab/zoo/code-first --chat 0 --code 400 --minutes 8 --threads 1

text      seed questions (chat template, where the tokenizer has one) and stdlib prefixes (none a
          bench prompt), each continued `--max-new` tokens by the target, greedy (specdecpp's helpers)
label     per prompt, the prefill at full depth gives the routers' features (drafters/first.py:
          prompt_features); then the continuation is teacher-forced after that cache once at full
          depth and once per layer i = 1..L-2 with layer i skipped, as FiRST decodes; d_i = the mean
          KL(full || skipped) over the continuation's rows. Label y_i = 1 for the `budget` =
          round(skip_ratio L) layers of smallest d_i on that prompt (the budget sets the skip rate)
fit       Routers: binary cross-entropy of each layer's score against y_i, full batch, Adam with
          an L2 penalty, features standardised on the training prompts, each router's bias started
          at its layer's label frequency (step 0 ranks as the fixed set); every `--eval-every` steps
          the dev prompts' ranking is scored (the share of the chosen layers labelled skippable) and
          the best step kept (step 0 included)
report    on the held-out prompts, the real quality of the skip sets of equal size (the same speed):
          the routers' choice, the fixed set (the layers labelled skippable most often in training),
          the even pattern (Unified Layer Skipping's) and the labels' own set: mean KL to the full
          target, top-1 agreement with the text, NLL of the text per token (the full target's beside)

Writes first.json (the part's config with the labels' layer frequencies, the curve and the report),
first.safetensors (fp32) and speclab_train.json (the command, steps, curve, held-out report).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.decoding.drafters.first import Routers, choose, prompt_features, save_routers
from speclab.models.lean.skips import SkipSet
from speclab.train.loop import add_threads_and_seed, command_line


def get_args(argv):
    ap = argparse.ArgumentParser(prog="speclab train first", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="code-target", help="the target (a zoo name or a directory)")
    ap.add_argument("--out", required=True, help="the routers' directory (first.json, first.safetensors)")
    ap.add_argument("--dtype", default="auto", help="auto, bf16 or fp32 (label and run in the same dtype)")
    ap.add_argument("--chat", type=int, default=100, help="seed questions the target answers")
    ap.add_argument("--code", type=int, default=200, help="stdlib prefixes the target continues")
    ap.add_argument("--max-new", type=int, default=32, help="continuation tokens per prompt")
    ap.add_argument("--skip-ratio", type=float, default=0.25, help="the budget: layers labelled skippable / L")
    ap.add_argument("--held-frac", type=float, default=0.2, help="prompts held out for the report")
    ap.add_argument("--minutes", type=float, default=10.0, help="wall budget: labelling stops at 85%% of it")
    ap.add_argument("--max-steps", type=int, default=3000, help="full-batch Adam steps")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--l2", type=float, default=1.0, help="penalty on the routers' weights (sum of squares a layer)")
    ap.add_argument("--labels", default=None, help="a safetensors file the labels are cached in (reused where it "
                                                   "holds this target's, dtype's, length's and seed's)")
    add_threads_and_seed(ap, threads=1)
    return ap.parse_args(argv)


def lean_of(target):
    from speclab.models.lean.forward import LeanLM
    return LeanLM(target, "first-labels")


@torch.inference_mode()
def label_row(lm, ids: list[int], n_prompt: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(features (L-2, C), d (L-2,)): the prompt's features and each layer's skip KL on the continuation."""
    L = len(lm.layers)
    lm.reset()
    lm.capture_layers = tuple(range(1, L - 1))
    lm.forward(torch.tensor(ids[:n_prompt]), logits_to_keep=1)
    f = prompt_features(lm.captured, L)
    lm.capture_layers = ()
    rows = torch.tensor(ids[n_prompt:-1])
    logp = lm.forward(rows).log_softmax(-1)
    d = []
    for i in range(1, L - 1):
        lm.n = n_prompt
        q = lm.forward(rows, skip=SkipSet.layers({i})).log_softmax(-1)
        d.append(F.kl_div(q, logp, log_target=True, reduction="none").sum(-1).mean())
    return f, torch.stack(d)


@torch.inference_mode()
def quality(lm, ids: list[int], n_prompt: int, skip: list[int]) -> tuple[float, float, float]:
    """(KL to the full target, top-1 agreement with the text, NLL of the text) per continuation row,
    decoding with `skip` after a full prefill."""
    rows, nxt = torch.tensor(ids[n_prompt:-1]), torch.tensor(ids[n_prompt + 1:])
    lm.reset()
    lm.forward(torch.tensor(ids[:n_prompt]), logits_to_keep=1)
    full = lm.forward(rows).log_softmax(-1)
    lm.n = n_prompt
    q = lm.forward(rows, skip=SkipSet.layers(skip) if skip else None).log_softmax(-1)
    kl = F.kl_div(q, full, log_target=True, reduction="none").sum(-1).mean().item()
    return kl, (q.argmax(-1) == nxt).float().mean().item(), -q.gather(1, nxt[:, None]).mean().item()


def labels_of(d: torch.Tensor, budget: int) -> torch.Tensor:
    """(N, R) 1 for the `budget` smallest d of each row."""
    y = torch.zeros_like(d)
    y.scatter_(1, d.argsort(1)[:, :budget], 1.0)
    return y


def precision(scores: torch.Tensor, y: torch.Tensor, budget: int) -> float:
    """The share of each prompt's `budget` top-scored layers that its labels call skippable."""
    top = scores.argsort(1, descending=True)[:, :budget]
    return y.gather(1, top).mean().item()


def main(argv=None):
    argv, a = command_line(get_args, argv)
    import speclab
    from safetensors.torch import load_file, save_file
    t_start = time.time()
    target, tok = speclab.load(a.target, dtype=a.dtype)
    L, C = len(target.model.layers), target.config.hidden_size
    budget = min(round(a.skip_ratio * L), L - 2)
    cache = Path(a.labels) if a.labels else None
    key = {"target": a.target, "dtype": a.dtype, "max_new": str(a.max_new), "seed": str(a.seed)}
    if cache is not None and cache.exists():
        from safetensors import safe_open
        with safe_open(str(cache), "pt") as fh:
            if fh.metadata() != key:
                raise SystemExit(f"{cache} holds labels for {fh.metadata()}, not {key}: pass another --labels file")
        t = load_file(str(cache))
        off = t["offsets"].tolist()
        data = {"features": t["features"], "kl": t["kl"], "n_prompt": t["n_prompt"].tolist(),
                "ids": [t["tokens"][x:y].tolist() for x, y in zip(off, off[1:])]}
        print(f"labels: {len(off) - 1} prompts from {cache}", flush=True)
    else:
        data = collect_rows(a, target, tok, t_start + 0.85 * a.minutes * 60)
        if cache is not None:
            lens = torch.tensor([len(r) for r in data["ids"]])
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(".tmp")
            save_file({"features": data["features"], "kl": data["kl"], "n_prompt": torch.tensor(data["n_prompt"]),
                       "tokens": torch.tensor([x for r in data["ids"] for x in r]),
                       "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)])}, str(tmp), key)
            tmp.replace(cache)
    X, D = data["features"].float(), data["kl"].float()
    N = len(X)
    if N < 4:
        raise SystemExit(f"only {N} prompts labelled: raise --minutes or --chat / --code")
    Y = labels_of(D, budget)
    order = list(range(N))
    random.Random(a.seed).shuffle(order)
    n_held = max(2, round(N * a.held_frac))
    n_dev = max(2, round((N - n_held) * a.held_frac))
    held, dev, train = order[:n_held], order[n_held:n_held + n_dev], order[n_held + n_dev:]
    model = Routers(L, C)
    model.mu.copy_(X[train].mean(0))
    model.sigma.copy_(X[train].std(0).clamp_min(1e-4))
    freq = Y[train].mean(0)
    with torch.no_grad():          # step 0 is the fixed set: each router starts at its layer's label frequency
        model.b.copy_(torch.logit(freq.clamp(0.02, 0.98)))
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    curve, best, best_state = [], (-1.0, 0.0), None
    fixed_prec = precision(freq.expand(len(dev), -1), Y[dev], budget)
    for step in range(0, a.max_steps + 1):
        if step:
            loss = (F.binary_cross_entropy_with_logits(model.logits(X[train]), Y[train])
                    + a.l2 * model.w.pow(2).sum(-1).mean())
            opt.zero_grad()
            loss.backward()
            opt.step()
        if step % a.eval_every == 0 or step == a.max_steps:
            with torch.no_grad():
                s = model(X[dev])
                ev = {"step": step, "loss": round(F.binary_cross_entropy(model(X[train]), Y[train]).item(), 4),
                      "dev_loss": round(F.binary_cross_entropy(s, Y[dev]).item(), 4),
                      "dev_precision": round(precision(s, Y[dev], budget), 4)}
            curve.append(ev)
            print(f"step {step}: {ev} (fixed set: {fixed_prec:.4f})", flush=True)
            if (ev["dev_precision"], -ev["dev_loss"]) > best:        # ties: the lower dev loss
                best = (ev["dev_precision"], -ev["dev_loss"])
                best_state = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    model.eval()
    report = held_out_report(a, target, model, data, held, freq, budget, L)
    with torch.no_grad():
        held_prec = precision(model(X[held]), Y[held], budget)
    report.update(prompts=N, train=len(train), dev=len(dev), held=len(held), budget=budget,
                  dev_precision={"fixed": round(fixed_prec, 4), "router": round(best[0], 4)},
                  held_precision={"fixed": round(precision(freq.expand(len(held), -1), Y[held], budget), 4),
                                  "router": round(held_prec, 4)})
    print(json.dumps(report, indent=1), flush=True)
    meta = {"target": a.target, "dtype": str(next(target.parameters()).dtype).removeprefix("torch."),
            "skip_ratio": a.skip_ratio, "budget": budget, "label_freq": [round(v, 4) for v in freq.tolist()],
            "held_out": report}
    save_routers(model, a.out, meta)
    info = {"command": "speclab train first " + " ".join(argv), "steps": a.max_steps, "curve": curve,
            "held_out": report, "minutes": round((time.time() - t_start) / 60, 1)}
    tmp = Path(a.out) / "speclab_train.json.tmp"
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(Path(a.out) / "speclab_train.json")
    print(f"wrote {a.out}")
    return 0


def collect_rows(a, target, tok, deadline: float) -> dict:
    """collect() with each row's prompt length kept."""
    from speclab.train.specdecpp import prompts_for, write_text
    prompts = prompts_for(tok, a.chat, a.code, a.seed)
    random.Random(a.seed).shuffle(prompts)
    lm, F_, D, rows, n_prompt, t0 = lean_of(target), [], [], [], [], time.time()
    for i in range(0, len(prompts), 8):
        if time.time() > deadline:
            print(f"labels: the budget ends labelling at {len(rows)} of {len(prompts)} prompts", flush=True)
            break
        for ids, n in write_text(target, tok, prompts[i:i + 8], a.max_new, log=lambda *x, **k: None):
            if len(ids) - n < 3:
                continue
            f, d = label_row(lm, ids, n)
            F_.append(f)
            D.append(d)
            rows.append(ids)
            n_prompt.append(n)
        print(f"labels: {len(rows)} prompts, {time.time() - t0:.0f} s", flush=True)
    return {"features": torch.stack(F_), "kl": torch.stack(D), "ids": rows, "n_prompt": n_prompt}


def held_out_report(a, target, model, data, held, freq, budget: int, L: int) -> dict:
    """Mean KL / agreement / NLL over the held-out prompts of each skip set of `budget` layers."""
    from speclab.decoding.drafters.swift import even_pattern
    lm = lean_of(target)
    fixed = choose([None] + freq.tolist() + [None], budget, 0.0)
    even = sorted(even_pattern(L, L / max(L - budget, 1)).whole)
    sums: dict[str, list[float]] = {}
    with torch.no_grad():
        scores = model(data["features"][held].float())
    for j, h in enumerate(held):
        ids, n = data["ids"][h], data["n_prompt"][h]
        routed = choose([None] + scores[j].tolist() + [None], budget, 0.0)
        labelled = sorted(1 + i for i in data["kl"][h].argsort()[:budget].tolist())
        for name, skip in (("full", []), ("router", routed), ("fixed", fixed), ("even", even), ("labels", labelled)):
            v = quality(lm, ids, n, skip)
            s = sums.setdefault(name, [0.0, 0.0, 0.0])
            for k in range(3):
                s[k] += v[k]
    out = {name: {"kl": round(s[0] / len(held), 4), "agree": round(s[1] / len(held), 4),
                  "nll": round(s[2] / len(held), 4)} for name, s in sums.items()}
    out["sets"] = {"fixed": fixed, "even": even}
    return out


if __name__ == "__main__":
    sys.exit(main())
