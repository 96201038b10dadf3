"""Train Judge decoding's probe (speclab/models/judge.py) for a target and a draft.

    speclab train judge --target smollm2-135m --draft smollm2-draft --out speclab-zoo/speclab_zoo/smollm2-judge

The target is frozen; only the probe (one weight per hidden unit) trains. Judge decoding (Bachmann
et al., ICLR 2025) labels tokens by hand ("TokenCourt"); speclab mines its labels as AutoJudge
(Garipov et al. 2025) does, from the target itself:

  1. text       the target writes it: greedy answers to the seed questions and greedy continuations
                of training-side stdlib prefixes (speclab/train/specdecpp.py's, and its cache)
  2. mismatches the draft reads the target's text X; at each written position t where its greedy
                token Z_t is not X_t (the exact rule would reject it), one example
  3. labels     does the target's own continuation survive the swap? Over a window of w tokens,
                   swapped  = -log p(Z_t | X_<t) + sum_j -log p(X_t+j | X_<t, Z_t, X_t+1..t+j-1)
                   original = -log p(X_t | X_<t) + sum_j -log p(X_t+j | X_<t+j)          j = 1..w
                Z_t is acceptable iff swapped - original <= margin (nats, over the whole window):
                the target, having read Z_t, still writes what it wrote, about as surely
  4. features   the target's state after its last layer at Z_t's own position (pre-norm), read in
                the same forward that scores the window: X and every swapped window go through the
                target once per row, each window attending to X_<t and itself (a 4-D mask); and
                p(Z_t), the target's own probability of the token
  5. probe      logistic regression (L-BFGS, L2), mu and sd from the training rows; the threshold
                the rule defaults to is the lowest whose training precision reaches --precision
  6. held out   a share of the rows (--held-frac): AUC, precision and recall at that threshold,
                beside the same numbers for the target's own p(Z_t) as the score (what a rule
                reading only the verify's logits could do), written into judge.json

The probe is written with its evaluation (judge.safetensors + judge.json, atomic); docs/training.md
has what the SmolLM2 probe reaches.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from speclab.models.judge import JudgeProbe, save_judge
from speclab.train.loop import add_threads_and_seed
from speclab.train.specdecpp import (add_text_options, auc, cached_examples, cached_text, prompts_for, split,
                                     write_text)


@torch.inference_mode()
def examples(target, draft, rows, window: int = 8, chunk: int = 48, log=None):
    """(features (N, C) fp32, swapped - original NLL (N,), p(Z_t) (N,)) over every mismatch of every
    row that leaves a whole window after it (a label: that difference <= the margin). chunk:
    windows per forward."""
    from tqdm.auto import tqdm
    L = target.config.num_hidden_layers
    got = {}
    hook = target.model.layers[L - 1].register_forward_hook(
        lambda _m, _i, out: got.__setitem__("h", out[0] if isinstance(out, tuple) else out))
    xs, ps, ds = [], [], []
    try:
        for ids, n in tqdm(rows, desc="judge examples", disable=log is None, mininterval=5):
            X = torch.tensor(ids)
            T = len(ids)
            z = draft(X[None]).logits[0].argmax(-1)                   # (T,) Z_t at z[t - 1]
            lp = target(X[None]).logits[0].float().log_softmax(-1)   # (T, V): p_t at lp[t - 1]
            ts = [t for t in range(max(n, 1), T - window) if int(z[t - 1]) != ids[t]]
            for i in range(0, len(ts), chunk):
                part = ts[i:i + chunk]
                h, nll_swap = _windows(target, X, lp, z, part, window, got)
                orig = torch.stack([-lp[t - 1:t + window].gather(-1, X[t:t + window + 1, None])[:, 0].sum()
                                    for t in part])
                swap_cost = torch.stack([-lp[t - 1, z[t - 1]] for t in part])
                d = nll_swap + swap_cost - orig
                xs.append(h), ds.append(d)
                ps.append(torch.stack([lp[t - 1, z[t - 1]].exp() for t in part]))
    finally:
        hook.remove()
    return torch.cat(xs), torch.cat(ds), torch.cat(ps)


def _windows(target, X, lp, z, ts, w, got):
    """One forward over X and the swapped windows [Z_t, X_t+1..X_t+w] of positions ts, each attending
    to X_<t and itself: the target's state at each Z_t (len(ts), C) and each window's NLL of
    X_t+1..X_t+w after Z_t."""
    T, k = len(X), len(ts)
    seq = torch.cat([X] + [torch.cat([z[t - 1:t], X[t + 1:t + w]]) for t in ts])   # window j: w tokens
    n = T + k * w
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[:T, :T] = torch.ones(T, T, dtype=torch.bool).tril()
    pos = [torch.arange(T)]
    tri = torch.ones(w, w, dtype=torch.bool).tril()
    for j, t in enumerate(ts):
        a = T + j * w
        allowed[a:a + w, :t] = True
        allowed[a:a + w, a:a + w] = tri
        pos.append(torch.arange(t, t + w))
    mask = torch.zeros(1, 1, n, n).masked_fill(~allowed, float("-inf"))
    logits = target(seq[None], attention_mask=mask.to(next(target.parameters()).dtype),
                    position_ids=torch.cat(pos)[None]).logits[0].float()
    h = got["h"][0].float()
    nll = []
    for j, t in enumerate(ts):
        a = T + j * w
        lw = logits[a:a + w].log_softmax(-1)                        # after Z_t, X_t+1, ..., X_t+w-1
        nll.append(-lw.gather(-1, X[t + 1:t + w + 1, None])[:, 0].sum())
    return h[[T + j * w for j in range(k)]], torch.stack(nll)


def fit(probe: JudgeProbe, X: torch.Tensor, p: torch.Tensor, y: torch.Tensor, l2: float = 1e-3,
        steps: int = 200) -> float:
    """Logistic regression by full-batch L-BFGS; returns the final training loss."""
    probe.fit_scale(X, p)
    f = ((probe.features(X, p) - probe.mu) / probe.sd).detach()
    y = y.float()
    opt = torch.optim.LBFGS([probe.w, probe.b], lr=1, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(f @ probe.w + probe.b, y) + l2 * probe.w.square().sum()
        loss.backward()
        return loss
    with torch.enable_grad():
        opt.step(closure)
        return float(closure().detach())


def threshold_for(score: torch.Tensor, y: torch.Tensor, precision: float) -> float:
    """The lowest threshold whose precision over (score, y) reaches `precision` (1.0: none does)."""
    order = score.argsort(descending=True)
    s, hit = score[order], y[order].float()
    prec = hit.cumsum(0) / torch.arange(1, len(s) + 1)
    ok = torch.nonzero(prec >= precision).flatten()
    return float(s[ok[-1]]) if len(ok) else 1.0


def at(score: torch.Tensor, y: torch.Tensor, thr: float) -> dict:
    """Precision, recall and the share passed of `score > thr` against labels y."""
    pick = score > thr
    tp = int((pick & y).sum())
    return {"precision": round(tp / max(1, int(pick.sum())), 4), "recall": round(tp / max(1, int(y.sum())), 4),
            "passed": round(float(pick.float().mean()), 4)}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="speclab train judge", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="smollm2-draft")
    ap.add_argument("--out", required=True, help="the probe's directory (judge.json, judge.safetensors)")
    ap.add_argument("--dtype", default="bf16", help="the dtype the target writes its text in (the text cache's)")
    add_text_options(ap, chat=64, code=32, max_new=96)
    ap.add_argument("--window", type=int, default=8, help="tokens of the target's continuation a label reads")
    ap.add_argument("--margin", type=float, default=6.0, help="nats over the window a swap may cost and pass")
    ap.add_argument("--precision", type=float, default=0.8, help="training precision the default threshold keeps")
    ap.add_argument("--l2", type=float, default=0.01, help="the weights' L2 penalty")
    ap.add_argument("--held-frac", type=float, default=0.2)
    add_threads_and_seed(ap)
    args = ap.parse_args(argv)
    if args.window < 1 or args.margin < 0 or not 0 < args.precision <= 1:
        raise SystemExit("speclab train judge: --window >= 1, --margin >= 0 and 0 < --precision <= 1")
    torch.set_num_threads(args.threads)
    from speclab.models.zoo import load
    target, tok = load(args.target, device="cpu", dtype=args.dtype)
    draft, _ = load(args.draft, device="cpu", dtype="float32")
    cache = Path(args.cache or f"~/.cache/speclab/specdecpp/{args.target}.safetensors").expanduser()
    key = {"target": args.target, "dtype": str(next(target.parameters()).dtype), "chat": args.chat,
           "code": args.code, "max_new": args.max_new, "seed": args.seed}
    rows = cached_text(cache, key, lambda: write_text(
        target, tok, prompts_for(tok, args.chat, args.code, args.seed), args.max_new))
    target = target.float()                    # the labels' forwards in fp32 (the text is the cache's)
    train_rows, held_rows = split(rows, args.held_frac, args.seed)
    t0 = time.time()
    ex = cache.with_name(f"{cache.stem}-{Path(args.draft).name}-judge-w{args.window}-{args.held_frac}.safetensors")
    Xt, dt, pt, Xh, dh, ph = cached_examples(ex, dict(key, draft=args.draft, window=args.window), lambda: (
        *examples(target, draft, train_rows, args.window, log=print),
        *examples(target, draft, held_rows, args.window, log=print)))
    yt, yh = dt <= args.margin, dh <= args.margin
    print(f"examples: {len(yt)} train, {len(yh)} held out ({time.time() - t0:.0f} s); acceptable "
          f"{float(yt.float().mean()):.3f} / {float(yh.float().mean()):.3f}", flush=True)
    probe = JudgeProbe(target.config.hidden_size)
    loss = fit(probe, Xt, pt, yt, args.l2)
    st, sh = probe.score(Xt, pt), probe.score(Xh, ph)
    thr = threshold_for(st, yt, args.precision)
    thr_p = threshold_for(pt, yt, args.precision)
    held = {"auc": round(auc(sh, yh), 4), **at(sh, yh, thr), "base_rate": round(float(yh.float().mean()), 4),
            "n": len(yh)}
    held_p = {"auc": round(auc(ph, yh), 4), **at(ph, yh, thr_p), "threshold": round(thr_p, 4)}
    print(f"held out: probe {json.dumps(held)} at threshold {thr:.3f}; p(Z_t) as the score {json.dumps(held_p)}; "
          f"training loss {loss:.4f}", flush=True)
    command = "speclab train judge " + " ".join(sys.argv[1:] if argv is None else argv)
    meta = {"target": args.target, "draft": args.draft, "window": args.window, "margin": args.margin,
            "threshold": round(thr, 4), "precision_goal": args.precision, "n_train": len(yt),
            "train_auc": round(auc(st, yt), 4), "held_out": held, "held_out_p_baseline": held_p, "command": command}
    save_judge(probe, args.out, meta)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
