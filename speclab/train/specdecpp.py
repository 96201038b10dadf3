"""Train SpecDec++'s acceptance head (speclab/models/acceptance_head.py) for a draft model.

    speclab train specdecpp --target smollm2-135m --draft smollm2-draft \\
        --out speclab-zoo/speclab_zoo/smollm2-specdecpp --minutes 20 --compare 3

Both models are frozen; only the head trains (Huang et al., COLM 2025; their `data/gen_acceptance.py`
and `specdec_pp/train.py`):

  1. text      the target writes it: greedy answers to the seed questions (speclab/train/
               seed_questions.txt, in the chat template; none for a tokenizer without one) and
               greedy continuations of training-side stdlib prefixes; cached in --cache
  2. labels    the draft reads the target's text X: at every position t the target wrote, its
               token Z_t (greedy: argmax q; --labels soft: Z_t ~ q) and the label a_t:
               greedy 1[Z_t == argmax p_t] (what a greedy verify accepts); soft min(1, p(Z_t) / q(Z_t))
               (the acceptance probability of speculative sampling at T = 1)
  3. features  the draft reads M: X with Z_t at each written position, except a share `--mixing`
               of them that keep X_t and carry no loss (the paper's mixing ratio, 0.15). A feature is
               the draft's state after its last layer at Z_t (--reads token, the paper's), or at the
               position before, the state that drafted Z_t (--reads context), from speclab's own
               forward of the draft (what the drafter reads at run time)
  4. loss      weighted soft BCE  w (1 - a)(-log s_0) + a (-log s_1), over w sum(1 - a) + sum(a);
               w = --weight-mismatch (1: the head's probabilities stay calibrated, which the
               stopping rule's threshold assumes; the paper's README trains with 6)
  5. held out  a share of the rows (--held-frac): AUC, Brier score, expected calibration error and
               the base rate, written into head.json
  6. compare   (--compare N) specdec++ against draft-model at every fixed k <= max_k on the first N
               prompts of --dev-prompts, greedy: tau and the cost model's expected speed-up

The head is written with its held-out evaluation (head.safetensors + head.json, atomic); docs/training.md
has what the shipped toy head and a SmolLM2 head reach.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

from speclab.models.acceptance_head import AcceptanceHead, for_draft, save_head
from speclab.train.loop import BudgetLoop, add_threads_and_seed, cosine_lr, set_lr



# ----------------------------------------------------------------------------------------------
# 1. the target's own text

def prompts_for(tok, n_chat: int, n_code: int, seed: int) -> list[list[int]]:
    """The seed questions in the chat template (when the tokenizer has one), then stdlib prefixes."""
    from speclab.models.loading import chat_prompt
    from speclab.train.smollm2_data import code_prefixes, seed_questions
    out = []
    if getattr(tok, "chat_template", None):
        out += [chat_prompt(tok, q) for q in seed_questions()[:n_chat]]
    return out + code_prefixes(tok, n_code, random.Random(seed), lo=32, hi=96)


def write_text(target, tok, prompts: list[list[int]], max_new: int, batch: int = 8,
               log=print) -> list[tuple[list[int], int]]:
    """(prompt + the target's greedy continuation, prompt length) per prompt."""
    from speclab.api import generate
    rows, t0 = [], time.time()
    for i in range(0, len(prompts), batch):
        group = prompts[i:i + batch]
        for p, r in zip(group, generate((target, tok), group, "ar", max_new_tokens=max_new, record=None)):
            rows.append((p + r.ids, len(p)))
        log(f"text: {len(rows)}/{len(prompts)} rows, {sum(len(t) - n for t, n in rows)} tokens, "
            f"{time.time() - t0:.0f} s", flush=True)
    return rows


def cached_text(cache: Path, key: dict, make) -> list[tuple[list[int], int]]:
    """The rows in `cache` if they were written for `key`, else make() written there (atomic)."""
    from safetensors.torch import load_file, save_file
    meta = cache.with_suffix(".json")
    if cache.exists() and meta.exists() and json.loads(meta.read_text()) == key:
        t = load_file(str(cache))
        off = t["offsets"].tolist()
        return [(t["tokens"][a:b].tolist(), n) for a, b, n in zip(off, off[1:], t["n_prompt"].tolist())]
    rows = make()
    lens = torch.tensor([len(r) for r, _ in rows])
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    save_file({"tokens": torch.tensor([x for r, _ in rows for x in r], dtype=torch.int64),
               "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]),
               "n_prompt": torch.tensor([n for _, n in rows], dtype=torch.int64)}, str(tmp))
    tmp.replace(cache)
    meta.write_text(json.dumps(key))
    return rows


# ----------------------------------------------------------------------------------------------
# 2-3. labels and features

@torch.inference_mode()
def examples(target, draft, rows, labels: str = "greedy", mixing: float = 0.15, seed: int = 0,
             backend: str = "auto", reads: str = "token") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features (N, C) fp32, labels (N,) in [0, 1] and the draft's own probability q(Z_t) (N,) (the
    baseline a head must beat) over every written position of every row that holds a draft token
    (the mixed-in X_t are left out: they carry no loss). reads: the feature of Z_t is the draft's
    state at Z_t ("token", the paper's) or the state that drafted Z_t, at t - 1 ("context")."""
    from speclab.models.backends import make_lm
    if labels not in ("greedy", "soft"):
        raise ValueError(f"labels must be 'greedy' or 'soft', got {labels!r}")
    p_lm, q_lm = make_lm(target, "target", backend), make_lm(draft, "draft", backend)
    L = draft.config.num_hidden_layers
    gen = torch.Generator().manual_seed(seed)
    xs, ys, qs = [], [], []
    for ids, n in rows:
        X = torch.tensor(ids, device=p_lm.device)
        T = len(ids)
        if T - n < 1:
            continue
        p_lm.reset(), q_lm.reset()
        lp = p_lm.forward(X)[n - 1:T - 1].log_softmax(-1)                  # (W, V): p_t for the W written tokens
        lq = q_lm.forward(X)[n - 1:T - 1].log_softmax(-1)                  # (W, V): q_t
        if labels == "greedy":
            Z = lq.argmax(-1)
            a = (Z == lp.argmax(-1)).float()
        else:
            Z = torch.multinomial(lq.exp().cpu(), 1, generator=gen)[:, 0].to(lq.device)
            a = (lp.gather(-1, Z[:, None]) - lq.gather(-1, Z[:, None]))[:, 0].clamp(max=0).exp()
        qs.append(lq.gather(-1, Z[:, None])[:, 0].exp().float().cpu())
        keep = torch.rand(T - n, generator=gen) < mixing                    # these positions keep X_t
        M = X.clone()
        M[n:] = torch.where(keep.to(X.device), X[n:], Z)
        q_lm.reset()
        q_lm.capture_layers = (L,)
        q_lm.forward(M)
        h = q_lm.captured[L][0, n:] if reads == "token" else q_lm.captured[L][0, n - 1:T - 1]
        h = h.float().cpu()                                                 # (W, C): the state read for each Z_t
        q_lm.capture_layers = ()
        xs.append(h[~keep])
        ys.append(a.float().cpu()[~keep])
        qs[-1] = qs[-1][~keep]
    return torch.cat(xs), torch.cat(ys), torch.cat(qs)


def cached_examples(path: Path, key: dict, make) -> tuple:
    """examples() for the train and held-out rows, kept in `path` (atomic) for the key they were
    made for: a second run with other training settings skips the models' forwards."""
    from safetensors.torch import load_file, save_file
    names = ("Xt", "yt", "qt", "Xh", "yh", "qh")
    meta = path.with_suffix(".json")
    if path.exists() and meta.exists() and json.loads(meta.read_text()) == key:
        t = load_file(str(path))
        return tuple(t[n] for n in names)
    got = make()
    tmp = path.with_suffix(".tmp")
    save_file({n: v.contiguous() for n, v in zip(names, got)}, str(tmp))
    tmp.replace(path)
    meta.write_text(json.dumps(key))
    return got


# ----------------------------------------------------------------------------------------------
# 4. loss and training

def weighted_bce(logits: torch.Tensor, a: torch.Tensor, w: float = 1.0) -> torch.Tensor:
    """The paper's soft BCE: class 0 (rejected) weighted w, normalised by the weights' sum."""
    lsm = logits.float().log_softmax(-1)
    loss = -(w * (1 - a) * lsm[:, 0] + a * lsm[:, 1]).sum()
    return loss / (w * (1 - a).sum() + a.sum()).clamp(min=1e-6)


def train_head(head: AcceptanceHead, X: torch.Tensor, y: torch.Tensor, minutes: float, batch: int = 256,
               lr: float = 1e-3, w: float = 1.0, seed: int = 0, epochs: float = 4, log=print) -> dict:
    """AdamW on the head alone for `epochs` passes over the examples or `minutes` of wall time,
    whichever ends first, the learning rate on a cosine over the run; returns the loop's state.
    A few passes: the head has C^2 weights and a draft's states are easy to memorise."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    state: dict = {}
    loop = BudgetLoop(state, len(X), batch, seed, minutes, every_minutes=1e9, save=lambda: None, desc="head")
    total = max(1, round(epochs * len(X) / batch))
    head.train()
    for idx in loop:
        set_lr(opt, cosine_lr(lr, state["step"], 20, max(loop.frac, state["step"] / total)))
        loss = weighted_bce(head(X[idx]), y[idx], w)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loop.bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        if state["step"] + 1 >= total:
            state["step"] += 1
            break
    head.eval()
    return state


# ----------------------------------------------------------------------------------------------
# 5. held-out evaluation

def auc(score: torch.Tensor, hit: torch.Tensor) -> float | None:
    """P(score of an accepted token > score of a rejected one), ties half (Mann-Whitney)."""
    pos, neg = score[hit], score[~hit]
    if not len(pos) or not len(neg):
        return None
    r = torch.cat([pos, neg]).double().argsort().argsort().double() + 1
    s = torch.cat([pos, neg]).double()
    for v in s.unique():                                                    # average ranks over ties
        m = s == v
        if m.sum() > 1:
            r[m] = r[m].mean()
    return float((r[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


@torch.no_grad()
def evaluate(head: AcceptanceHead, X: torch.Tensor, y: torch.Tensor, bins: int = 10) -> dict:
    """AUC (accepted = label >= 0.5), Brier score, ECE over `bins` equal-width bins of the predicted
    probability, the base rate and the mean prediction, and the calibration table (bin, mean
    prediction, mean label, count)."""
    a = head.p_accept(X).float()
    b = (a * bins).long().clamp(max=bins - 1)
    table, ece = [], 0.0
    for i in range(bins):
        m = b == i
        if m.any():
            table.append([i, round(float(a[m].mean()), 4), round(float(y[m].mean()), 4), int(m.sum())])
            ece += float(m.sum()) / len(y) * abs(float(a[m].mean() - y[m].mean()))
    return {"n": len(y), "auc": None if (r := auc(a, y >= 0.5)) is None else round(r, 4),
            "brier": round(float(((a - y) ** 2).mean()), 4), "ece": round(ece, 4),
            "base_rate": round(float(y.mean()), 4), "mean_pred": round(float(a.mean()), 4), "calibration": table}


# ----------------------------------------------------------------------------------------------
# 6. against draft-model's fixed k

@torch.inference_mode()
def step_costs(target, draft, head, max_k: int, context: int = 128, repeats: int = 25) -> dict:
    """Seconds of what a round is made of, each the fastest of `repeats` (a busy machine only ever
    slows a forward down; the widths are timed in turn, so a burst of load hits them alike): the
    target on w = 1..max_k+1 rows after `context` cached tokens (w = 1 is an ar step), the draft on
    one token, the head on one state."""
    import time as t
    from speclab.models.backends import make_lm
    ids = torch.arange(context + max_k + 1) % 1000 + 10
    lms = {"target": make_lm(target, "target"), "draft": make_lm(draft, "draft")}
    jobs = [("target", w) for w in range(1, max_k + 2)] + [("draft", 1)]
    for lm in lms.values():
        lm.reset()
        lm.forward(ids[:context], logits_to_keep=1)
    best = {j: float("inf") for j in jobs + [("head", 1)]}
    x = torch.randn(head.hidden_size)
    for _ in range(repeats):
        for who, w in jobs:
            t0 = t.perf_counter()
            lms[who].forward(ids[context:context + w], logits_to_keep=w)
            best[who, w] = min(best[who, w], t.perf_counter() - t0)
            lms[who].keep(context)
        t0 = t.perf_counter()
        head.p_accept(x).item()
        best["head", 1] = min(best["head", 1], t.perf_counter() - t0)
    verify = {w: best["target", w] for w in range(1, max_k + 2)}
    w = torch.tensor(list(verify), dtype=torch.float64)
    v = torch.tensor(list(verify.values()), dtype=torch.float64)
    slope = float(((w - w.mean()) * (v - v.mean())).sum() / ((w - w.mean()) ** 2).sum())
    # the verify's cost as a line in its rows, fitted by least squares: one noisy width moves it little
    fit = {int(x): float(v.mean()) + slope * (int(x) - float(w.mean())) for x in w}
    return {"verify": verify, "fit": fit, "draft": best["draft", 1], "head": best["head", 1]}


def fixed_speedup(traces, costs: dict, head: bool) -> float:
    """Tokens per ar step when each decode round costs what its parts cost alone (step_costs, the
    verify's line fitted over its widths): a verify of 1 + K rows, K draft steps (and K head calls
    for specdec++), against an ar step (the line at one row)."""
    tokens, steps = 0, 0.0
    for t in traces:
        for r in t.rounds[1:]:                              # the prompt's prefill round left out
            K = r.drafted
            tokens += len(r.accepted) + 1
            steps += (costs["fit"][K + 1] + K * (costs["draft"] + head * costs["head"])) / costs["fit"][1]
    return tokens / steps


def compare(target, draft, head_dir, prompts, max_new: int, ks, thresholds=(0.3,), chat: bool = False,
            backend: str = "exact", log=print) -> list[dict]:
    """Greedy runs on each prompt: ar, draft-model at each k and with its own stop on the draft's
    confidence (q of its token below 0.3 / 0.6, no cost gate), specdec++ at each threshold; per
    method tau, the mean K, and three speed-ups: the cost model's expected one from the run's own
    timings (speclab.metrics.cost_model), the measured one, and `fixed`: the same cost model with
    each part's cost from step_costs, which contention from other processes moves less. The runs
    take the `exact` backend, so every output must be `ar`'s token for token (a verify's rows in
    bf16 on a CPU without AVX512-BF16 can round a near-tie otherwise: docs/performance.md)."""
    import speclab
    from speclab.metrics import cost_model
    from speclab.models.acceptance_head import load_head
    kw = dict(max_new_tokens=max_new, record="light", chat=chat, backend=backend)
    costs = step_costs(target[0], draft[0], load_head(head_dir), max(ks))
    log("costs (ms): " + json.dumps({"ar": round(costs["verify"][1] * 1e3, 2), "draft": round(costs["draft"] * 1e3, 2),
                                     "head": round(costs["head"] * 1e3, 3),
                                     "verify": {w: round(v * 1e3, 2) for w, v in costs["verify"].items()},
                                     "fit": {w: round(v * 1e3, 2) for w, v in costs["fit"].items()}}), flush=True)
    refs = [speclab.generate(target, p, "ar", **kw).trace for p in prompts]
    runs = [("draft-model", f"k={k}", dict(k=k)) for k in ks]
    runs += [("draft-model", f"q<{t}", dict(threshold=t, max_k=max(ks), gate="off")) for t in (0.3, 0.6)]
    runs += [("specdec++", f"h={h}", dict(threshold=h, max_k=max(ks), head=str(head_dir))) for h in thresholds]
    out = []
    for method, label, params in runs:
        traces = [speclab.generate(target, p, method, draft=draft, **kw, **params).trace for p in prompts]
        for t, r in zip(traces, refs):
            if t.output_ids != r.output_ids:
                raise AssertionError(f"{method} {label} diverged from ar: a lossless method must not")
        m = cost_model(traces, refs)
        rounds = [r for t in traces for r in t.rounds[1:]]
        row = {"method": method, "setting": label,
               "tau": round(sum(len(r.accepted) + 1 for r in rounds) / len(rounds), 3),
               "mean_k": round(sum(r.drafted for r in rounds) / len(rounds), 2),
               "fixed_speedup": round(fixed_speedup(traces, costs, method == "specdec++"), 3),
               "expected_speedup": round(m["expected_speedup"], 3), "measured_speedup": round(m["measured_speedup"], 3)}
        log(json.dumps(row), flush=True)
        out.append(row)
    return out


# ----------------------------------------------------------------------------------------------

def split(rows: list, held_frac: float, seed: int) -> tuple[list, list]:
    idx = list(range(len(rows)))
    random.Random(seed).shuffle(idx)
    n = max(1, round(len(rows) * held_frac))
    return [rows[i] for i in sorted(idx[n:])], [rows[i] for i in sorted(idx[:n])]


def add_text_options(ap, *, chat: int, code: int, max_new: int) -> None:
    """The options of the target's text (write_text over prompts_for, kept by cached_text), for each
    trainer that labels it: this head's, the judge's probe (speclab/train/judge.py)."""
    ap.add_argument("--chat", type=int, default=chat, help="seed questions the target answers")
    ap.add_argument("--code", type=int, default=code, help="stdlib prefixes the target continues")
    ap.add_argument("--max-new", type=int, default=max_new, help="tokens the target writes per prompt")
    ap.add_argument("--cache", default=None, help="the target's text (default ~/.cache/speclab/specdecpp/TARGET)")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="speclab train specdecpp", description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="smollm2-draft")
    ap.add_argument("--out", required=True, help="the head's directory (head.json, head.safetensors)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--minutes", type=float, default=20.0, help="the head's training budget (wall time)")
    ap.add_argument("--epochs", type=float, default=4, help="passes over the examples (or --minutes, first)")
    add_text_options(ap, chat=124, code=96, max_new=128)
    ap.add_argument("--labels", choices=("greedy", "soft"), default="greedy")
    ap.add_argument("--mixing", type=float, default=0.15)
    ap.add_argument("--reads", choices=("token", "context"), default="token",
                    help="the state the head reads: the draft token's own (the paper's) or the one that drafted it")
    ap.add_argument("--weight-mismatch", type=float, default=1.0)
    ap.add_argument("--layers", type=int, default=3, help="applications of the shared ResBlock")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--held-frac", type=float, default=0.1)
    ap.add_argument("--compare", type=int, default=0, help="prompts of --dev-prompts for the comparison (0: none)")
    ap.add_argument("--compare-only", action="store_true", help="no training: compare the head in --out")
    ap.add_argument("--dev-prompts", default="chat-dev")
    ap.add_argument("--compare-new", type=int, default=64)
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--thresholds", default="0.3", help="specdec++ thresholds compared, comma-separated")
    add_threads_and_seed(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from speclab.models.zoo import load
    target, tok = load(args.target, device="cpu", dtype=args.dtype)
    draft, _ = load(args.draft, device="cpu", dtype=args.dtype)
    if not args.compare_only:
        train(args, target, tok, draft, argv)
    if args.compare or args.compare_only:
        from speclab.prompts import load_prompts
        rows = load_prompts(args.dev_prompts, limit=args.compare or 3)
        chat = any(isinstance(p, dict) for p in rows)
        got = compare((target, tok), (draft, tok), args.out, [p["chat"] if isinstance(p, dict) else p for p in rows],
                      args.compare_new, range(1, args.max_k + 1), [float(h) for h in args.thresholds.split(",")],
                      chat=chat)
        best = max((r for r in got if r["setting"].startswith("k=")), key=lambda r: r["fixed_speedup"])
        print(f"best fixed k: {best['setting']}: {best['fixed_speedup']}x (fixed costs), tau {best['tau']}", flush=True)
        tmp = Path(args.out) / "compare.json.tmp"
        tmp.write_text(json.dumps({"prompts": f"{args.dev_prompts}[:{len(rows)}]", "max_new_tokens": args.compare_new,
                                   "runs": got}, indent=1))
        tmp.replace(Path(args.out) / "compare.json")


def train(args, target, tok, draft, argv=None):
    """Steps 1-5: the text, the examples, the head trained and evaluated, written to args.out."""
    cache = Path(args.cache or f"~/.cache/speclab/specdecpp/{args.target}.safetensors").expanduser()
    key = {"target": args.target, "dtype": str(next(target.parameters()).dtype), "chat": args.chat,
           "code": args.code, "max_new": args.max_new, "seed": args.seed}
    rows = cached_text(cache, key, lambda: write_text(
        target, tok, prompts_for(tok, args.chat, args.code, args.seed), args.max_new))
    train_rows, held_rows = split(rows, args.held_frac, args.seed)
    t0 = time.time()
    ex = cache.with_name(f"{cache.stem}-{Path(args.draft).name}-{args.labels}-{args.reads}-{args.mixing}-"
                         f"{args.held_frac}.safetensors")
    Xt, yt, _, Xh, yh, qh = cached_examples(ex, dict(key, draft=args.draft), lambda: (
        *examples(target, draft, train_rows, args.labels, args.mixing, args.seed, reads=args.reads),
        *examples(target, draft, held_rows, args.labels, args.mixing, args.seed + 1, reads=args.reads)))
    print(f"examples: {len(yt)} train, {len(yh)} held out ({time.time() - t0:.0f} s); acceptance "
          f"{float(yt.mean()):.3f} / {float(yh.mean()):.3f}; the draft's own q as the predictor: held-out auc "
          f"{auc(qh, yh >= 0.5):.4f}", flush=True)
    head = for_draft(draft, args.layers)
    before = evaluate(head, Xh, yh)
    state = train_head(head, Xt, yt, args.minutes, args.batch, args.lr, args.weight_mismatch, args.seed,
                       args.epochs)
    held = evaluate(head, Xh, yh)
    print(f"held out: {json.dumps({k: v for k, v in held.items() if k != 'calibration'})} "
          f"(untrained auc {before['auc']}); {state['step']} steps", flush=True)
    command = "speclab train specdecpp " + " ".join(sys.argv[1:] if argv is None else argv)
    meta = {"draft": args.draft, "target": args.target, "reads": args.reads, "labels": args.labels,
            "mixing": args.mixing, "weight_mismatch": args.weight_mismatch, "steps": state["step"], "n_train": len(yt),
            "held_out": held, "held_out_auc_of_q": round(auc(qh, yh >= 0.5), 4), "command": command}
    save_head(head, args.out, meta)
    print(f"wrote {args.out}", flush=True)

if __name__ == "__main__":
    main()
