"""Train Learn2PD's filter (speclab/models/learn2pd.py) for a masked-diffusion LM, on its own runs.

    speclab train learn2pd --dllm smollm2-dllm --out speclab-zoo/speclab_zoo/smollm2-dllm-learn2pd --minutes 35

The dLLM is frozen; only the filter trains ("Learning to Parallel Decode"; its repository's
`llada/generate_training_data.py` and `train.ipynb`):

  1. prompts    training-side prompts only, never the bench's held-out sets (chat, code-edit):
                the seed questions and chat-dev in the chat template (none for a tokenizer without
                one), code-edit-shaped prompts (a function, then its near-duplicate's first line)
                and plain prefixes, both from the corpus's training split
  2. reference  each prompt decoded one token per step (dllm-lowconf, greedy): y*, the token it
                finally commits at each slot (end of text past its answer's end)
  3. replay     the same prompt decoded again by the paper's oracle: every masked slot whose
                proposal already equals y* commits (the most confident if none does), so the
                examples also come from the few-step states a filter meets
  4. examples   at every step of both runs, for every masked slot of the active block: its
                features (FEATURES) and two labels: final = 1[x0 == y*] and, where x0 is end of
                text, end = 1[the reference's answer ended at or before this slot]
  5. train      the MLP with BCE on both outputs (end only on end-of-text rows), full batch AdamW;
                prompts are collected while 80% of --minutes lasts, the rest trains
  6. held out   a share of the prompts (--held-frac): precision, recall and the share committed at
                --threshold, and AUC, for both outputs, against p(x0) alone as the baseline;
                written into learn2pd.json

The filter is written atomically (learn2pd.safetensors + learn2pd.json).
"""
from __future__ import annotations

import argparse
import random
import sys
import time

import torch

from speclab.decoding.dllm_policies import DiffusionPolicy
from speclab.models.learn2pd import FEATURES, Learn2PDFilter, Stability, features, save_filter
from speclab.train.loop import add_threads_and_seed

# ----------------------------------------------------------------------------------------------
# 1. prompts


def code_edit_prompts(n: int, rng: random.Random, max_chars: int = 600) -> list[str]:
    """Prompts shaped like the code-edit set (a function, then `def copy_of_...` its first line),
    from the corpus's TRAINING split (the set itself comes from the held-out split)."""
    from speclab.train.corpus import read_text, source_files
    from speclab.train.prompt_sets import _functions
    texts = [read_text(f.path) for f in source_files("train")]
    out, tries = [], 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        t = rng.choice(texts)
        fns = [(s, e) for s, e in _functions(t) if e - s < max_chars - 100]
        if fns:
            s, e = rng.choice(fns)
            fn = t[s:e].rstrip() + "\n\n"
            out.append((fn + fn.splitlines()[0].replace("def ", "def copy_of_", 1))[-max_chars:])
    return out


def training_prompts(tok, n_chat: int, n_edit: int, n_code: int, seed: int) -> list[list[int]]:
    """Token ids, shuffled: chat questions (seed questions, then chat-dev), code-edit-shaped
    prompts and stdlib prefixes; all from the training side."""
    from speclab.models.loading import chat_prompt
    from speclab.prompts import load_prompts
    from speclab.train.smollm2_data import code_prefixes, seed_questions
    rng = random.Random(seed)
    out = []
    if getattr(tok, "chat_template", None) and n_chat:
        qs = seed_questions() + [p["chat"] for p in load_prompts("chat-dev")]
        out += [chat_prompt(tok, q) for q in qs[:n_chat]]
    out += [tok(p, add_special_tokens=False)["input_ids"] for p in code_edit_prompts(n_edit, rng)] if n_edit else []
    out += code_prefixes(tok, n_code, rng, lo=32, hi=160) if n_code else []
    rng.shuffle(out)
    return out


# ----------------------------------------------------------------------------------------------
# 2-4. runs and examples

class Recorder(DiffusionPolicy):
    """Wraps a commit policy: at every step, the features of the active block's masked slots
    (what the Learn2PD policy will read there), then the inner policy's choice."""

    def __init__(self, inner, eos_id):
        self.inner, self.eos, self.rows = inner, eos_id, []

    def plan(self, gen_length, n_blocks):
        self._stab = Stability(gen_length)
        return self.inner.plan(gen_length, n_blocks)

    def start_block(self, n_masked):
        self.inner.start_block(n_masked)

    def select(self, v):
        lo, hi = v.block
        stable = self._stab.update(v.x0, v.eligible)
        f = features(v.conf, v.logit_margin, v.entropy, stable, v.eligible, v.x0, (lo, hi), self.eos)
        keep = v.eligible[lo:hi].cpu()
        pos = torch.arange(lo, hi)[keep]
        self.rows.append((f[keep], v.x0[lo:hi].cpu()[keep], pos, v.conf[lo:hi].float().cpu()[keep]))
        return self.inner.select(v)


class Oracle(DiffusionPolicy):
    """The paper's "extremely greedy" replay: commit every masked slot of the block whose proposal
    already equals the reference's token there; the most confident when none does."""

    def __init__(self, ref: torch.Tensor):
        self.ref = ref

    def plan(self, gen_length, n_blocks):
        return gen_length

    def start_block(self, n_masked):
        pass

    def select(self, v):
        from speclab.decoding.dllm_policies import Choice, top_k_commit
        ok = v.eligible & (v.x0.cpu() == self.ref).to(v.eligible.device)
        return Choice(ok if ok.any() else top_k_commit(v.conf, v.eligible, 1))


def decode_examples(den, ids: list[int], G: int, block_length: int, eos_id) -> tuple:
    """Both runs of one prompt -> (features (N, F), final (N,), end (N,) with -1 where x0 is not end
    of text, p(x0) (N,)), and the reference's forwards and the replay's."""
    from speclab.decoding.diffusion import denoise
    from speclab.decoding.dllm_policies import LowConfidence
    ref_rec = Recorder(LowConfidence(), eos_id)
    out, _, t_ref = denoise(den, ids, ref_rec, G, block_length, record=None, eos_id=eos_id, eos_stop=True)
    ref = torch.full((G,), eos_id if eos_id is not None else -1, dtype=torch.long)
    ref[:len(out)] = torch.tensor(out, dtype=torch.long)
    end_at = len(out) - 1 if eos_id is not None and out and out[-1] == eos_id else G
    rep_rec = Recorder(Oracle(ref), eos_id)
    _, _, t_rep = denoise(den, ids, rep_rec, G, block_length, record=None, eos_id=eos_id, eos_stop=True)
    X, yf, ye, q = [], [], [], []
    for f, x0, pos, conf in ref_rec.rows + rep_rec.rows:
        X.append(f)
        yf.append((x0 == ref[pos]).float())
        e = (pos >= end_at).float()
        ye.append(torch.where(x0 == eos_id, e, torch.full_like(e, -1.0)) if eos_id is not None else -torch.ones_like(e))
        q.append(conf)
    return torch.cat(X), torch.cat(yf), torch.cat(ye), torch.cat(q), t_ref.target_forwards, t_rep.target_forwards


def collect(model, prompts: list[list[int]], G: int, block_length: int | None, eos_id, seconds: float,
            log=print) -> tuple[list[tuple], dict]:
    """decode_examples over the prompts until `seconds` pass; a progress bar in prompts."""
    from tqdm.auto import tqdm
    from speclab.models.dllm import make_denoiser
    den = make_denoiser(model)
    B = block_length or (min(den.B, G) if den.block_causal else G)
    got, fw, t0 = [], {"reference": 0, "replay": 0}, time.time()
    bar = tqdm(prompts, desc="runs", unit="prompt", mininterval=10)
    with torch.inference_mode():
        for ids in bar:
            if time.time() - t0 > seconds:
                log(f"runs: the budget is spent after {len(got)} of {len(prompts)} prompts", flush=True)
                break
            *ex, a, b = decode_examples(den, ids, G, B, eos_id)
            got.append(tuple(ex))
            fw["reference"], fw["replay"] = fw["reference"] + a, fw["replay"] + b
            bar.set_postfix(rows=sum(len(e[0]) for e in got), refresh=False)
    bar.close()
    return got, dict(fw, prompts=len(got), block_length=B)


# ----------------------------------------------------------------------------------------------
# 5. training

def loss_fn(logits: torch.Tensor, yf: torch.Tensor, ye: torch.Tensor) -> torch.Tensor:
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    loss = bce(logits[:, 0], yf)
    m = ye >= 0
    return loss + (bce(logits[m, 1], ye[m]) if m.any() else 0.0)


def train_filter(net: Learn2PDFilter, X, yf, ye, seconds: float, epochs: int = 3000, lr: float = 3e-3,
                 seed: int = 0) -> int:
    """Full-batch AdamW (the paper's recipe: lr 3e-3, full batch) for `epochs` or `seconds`; a
    progress bar in epochs. Returns the epochs run."""
    from tqdm.auto import tqdm
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
    t0, bar = time.time(), tqdm(range(epochs), desc="filter", unit="epoch", mininterval=10)
    net.train()
    done = 0
    for done in bar:
        loss = loss_fn(net(X), yf, ye)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if done % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
        if time.time() - t0 > seconds:
            break
    bar.close()
    net.eval()
    return done + 1


# ----------------------------------------------------------------------------------------------
# 6. held-out evaluation

def auc(score: torch.Tensor, hit: torch.Tensor) -> float | None:
    """P(score of a positive > score of a negative), ties half (Mann-Whitney, average ranks)."""
    pos_n, neg_n = int(hit.sum()), int((~hit).sum())
    if not pos_n or not neg_n:
        return None
    s = score.double()
    order = s.argsort()
    ranks = torch.empty_like(s)
    ranks[order] = torch.arange(1, len(s) + 1, dtype=torch.float64)
    uniq, inv = s.unique(return_inverse=True)                       # average ranks over ties
    mean_rank = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, ranks)
    mean_rank /= torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, torch.ones_like(ranks))
    r = mean_rank[inv]
    return float((r[hit].sum() - pos_n * (pos_n + 1) / 2) / (pos_n * neg_n))


def at_threshold(score: torch.Tensor, y: torch.Tensor, t: float) -> dict:
    pred, hit = score >= t, y >= 0.5
    tp = int((pred & hit).sum())
    return {"threshold": t, "precision": round(tp / max(int(pred.sum()), 1), 4),
            "recall": round(tp / max(int(hit.sum()), 1), 4), "committed": round(float(pred.float().mean()), 4)}


@torch.no_grad()
def evaluate(net: Learn2PDFilter, X, yf, ye, q, thresholds=(0.8, 0.9, 0.95)) -> dict:
    """Held-out rows: AUC, and precision / recall / the share committed at each threshold, for the
    final score and for p(x0) alone; the end score on the end-of-text rows."""
    s, e = net.scores(X)
    hit = yf >= 0.5
    m = ye >= 0
    out = {"n": len(yf), "base_rate": round(float(yf.mean()), 4),
           "final": {"auc": _r(auc(s, hit)), "at": [at_threshold(s, yf, t) for t in thresholds]},
           "p_x0": {"auc": _r(auc(q, hit)), "at": [at_threshold(q, yf, t) for t in thresholds]},
           "end": {"n": int(m.sum()), "base_rate": round(float(ye[m].mean()), 4) if m.any() else None,
                   "auc": _r(auc(e[m], ye[m] >= 0.5)) if m.any() else None,
                   "at": [at_threshold(e[m], ye[m], t) for t in thresholds] if m.any() else []}}
    return out


def _r(x):
    return None if x is None else round(x, 4)


# ----------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(prog="speclab train learn2pd", description=__doc__.split("\n\n")[0])
    ap.add_argument("--dllm", default="smollm2-dllm", help="the masked-diffusion LM (zoo name or directory)")
    ap.add_argument("--out", required=True, help="the filter's directory (learn2pd.json, learn2pd.safetensors)")
    ap.add_argument("--minutes", type=float, default=35.0, help="the whole budget: runs while 80%% lasts, then training")
    ap.add_argument("--chat", type=int, default=184, help="chat questions (seed questions, then chat-dev)")
    ap.add_argument("--code-edit", type=int, default=120, help="code-edit-shaped prompts from the training split")
    ap.add_argument("--code", type=int, default=60, help="stdlib prefixes")
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--block-length", type=int, default=None, help="default: the dLLM's own block (32 for smollm2-dllm)")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--held-frac", type=float, default=0.15, help="share of the prompts held out")
    ap.add_argument("--threshold", type=float, default=0.9, help="the threshold the held-out numbers lead with")
    ap.add_argument("--dtype", default="auto")
    add_threads_and_seed(ap)
    args = ap.parse_args(argv)
    for name in ("minutes", "gen_length", "hidden", "epochs"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if not 0 < args.held_frac < 1:
        ap.error(f"--held-frac must be in (0, 1), got {args.held_frac}")
    if not 0 < args.threshold <= 1:
        ap.error(f"--threshold must be in (0, 1], got {args.threshold}")
    torch.set_num_threads(args.threads)
    from speclab.models.dllm import is_dllm
    from speclab.models.zoo import load
    model, tok = load(args.dllm, device="cpu", dtype=args.dtype)
    if not is_dllm(model):
        ap.error(f"{args.dllm} is not a masked-diffusion LM: Learn2PD's filter reads a dLLM's runs (e.g. smollm2-dllm)")
    t0 = time.time()
    prompts = training_prompts(tok, args.chat, args.code_edit, args.code, args.seed)
    if not prompts:
        ap.error("no training prompts: raise --chat, --code-edit or --code")
    got, runs = collect(model, prompts, args.gen_length, args.block_length, tok.eos_token_id,
                        args.minutes * 60 * 0.8)
    if len(got) < 2:
        ap.error("fewer than 2 prompts were decoded in the budget: raise --minutes")
    idx = list(range(len(got)))
    random.Random(args.seed).shuffle(idx)
    n_held = max(1, round(len(got) * args.held_frac))
    cat = lambda ids, k: torch.cat([got[i][k] for i in ids])
    held, train = sorted(idx[:n_held]), sorted(idx[n_held:])
    Xt, yft, yet = (cat(train, k) for k in range(3))
    Xh, yfh, yeh, qh = (cat(held, k) for k in range(4))
    print(f"examples: {len(yft)} train rows ({len(train)} prompts), {len(yfh)} held out ({len(held)} prompts), "
          f"{time.time() - t0:.0f} s; final rate {float(yft.mean()):.3f}; end-of-text rows {int((yet >= 0).sum())}",
          flush=True)
    net = Learn2PDFilter(len(FEATURES), args.hidden)
    left = max(10.0, args.minutes * 60 - (time.time() - t0))
    epochs = train_filter(net, Xt, yft, yet, left, args.epochs, args.lr, args.seed)
    ev = evaluate(net, Xh, yfh, yeh, qh, tuple(sorted({0.8, 0.9, 0.95, args.threshold})))
    lead = next(a for a in ev["final"]["at"] if a["threshold"] == args.threshold)
    print(f"held out: final auc {ev['final']['auc']} (p(x0) alone {ev['p_x0']['auc']}), at {args.threshold}: "
          f"precision {lead['precision']} recall {lead['recall']}; end auc {ev['end']['auc']} "
          f"({ev['end']['n']} rows); {epochs} epochs", flush=True)
    command = "speclab train learn2pd " + " ".join(sys.argv[1:] if argv is None else argv)
    meta = {"dllm": args.dllm, "eos_id": tok.eos_token_id, "gen_length": args.gen_length,
            "labels": "final = 1[x0 == the one-per-step (dllm-lowconf) token]; end = 1[that answer ended at or "
                      "before the slot], on end-of-text proposals; runs: the one-per-step reference and the "
                      "oracle replay",
            "runs": runs, "n_train": len(yft), "epochs": epochs, "held_out": ev, "command": command}
    save_filter(net, args.out, meta)
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
