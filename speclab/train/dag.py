"""Train the DA-Transformers of the zoo: the DAG loss, glancing training, and two toy tasks whose
targets are genuinely multimodal (one input, several correct outputs).

  numwords   "305"        -> "three hundred five" | "three hundred and five"   ("and" optional after
             0..999999       every "hundred" that has a remainder: up to 4 variants per number)
  dates      "2024-03-05" -> "5 march 2024" | "march 5 2024" | "2024 march 5" | "the 5th of march 2024"
             1950..2049      (four word orders: the DAG has to branch at the first word; three have
                              the same length, so a per-position decode mixes them: "march march 2024")

The loss is the reference's dynamic programme over every path of the graph (section B.2 of the
research note) with a *safe* log-sum-exp: zero gradient, not NaN, when every input is -inf (a vertex
with no valid successor). Glancing (B.3, `number-random`): a no-grad pass finds the best alignment of
the target to vertices, and a share of the words the model got wrong is fed back as decoder input.

  python -m speclab.train.dag numwords --out speclab/zoo/numwords-dat --minutes 10
  python -m speclab.train.dag dates --out speclab/zoo/dates-dat --minutes 17 --glat-p 0,0 --upsample 4
  python -m speclab.train.dag dates --out speclab/zoo/dates-dat --minutes 11 --glat-p 0,0 --seed 1 --resume
(dates: glancing made the graph worse within a 10-minute budget, and lambda 2 kept a tail vertex
shared by three word orders; see BENCHMARKS.md)
`--resume` continues from the weights already in `--out` (same architecture, fresh optimizer and
warm-up); the saved step count is the total over every run.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from speclab.models.dag import BOS, EOS, PAD, DagConfig, DATransformer, Vocab, load_dag, save
# the toy tasks live below decoding and training alike (speclab.models.dag_tasks)
from speclab.models.dag_tasks import (MONTHS, ONES, TASKS, TENS, YEARS, Task, _all_dates, _below_1000,  # noqa: F401
                                      _ordinal, _sample_numwords, dates_parse, dates_variants, encode_source,
                                      heldout, numwords_parse, numwords_variants)


def make_batch(task: Task, vocab: Vocab, cfg: DagConfig, rng: random.Random, B: int):
    """B training pairs, one random valid variant each, never from the held-out split. All sources
    in a batch have the same length, so no compute goes to padded vertices."""
    held = set(heldout(task.name))
    src, tgt, n = [], [], None
    while len(src) < B:
        x = task.sample(rng)
        n = n or len(x)
        if x in held or len(x) != n:
            continue
        src.append(encode_source(task, vocab, x))
        tgt.append([BOS] + vocab.encode(rng.choice(task.variants(x))) + [EOS])
    pad = lambda rows: torch.tensor([r + [PAD] * (max(map(len, rows)) - len(r)) for r in rows])
    slen = torch.tensor([len(s) for s in src])
    glen = torch.tensor([cfg.num_vertices(int(n)) for n in slen])
    tlen = torch.tensor([len(t) for t in tgt])
    assert bool((tlen <= glen).all()), "graph smaller than target: raise upsample (pitfall D.12)"
    return pad(src), pad(tgt), tlen, glen


# -- the DAG loss (B.2) and the best alignment (B.3) -------------------------------------------------
def logsumexp_safe(x: torch.Tensor, dim: int) -> torch.Tensor:
    """logsumexp whose gradient is 0 (not NaN) where every input is -inf (pytorch#31829)."""
    m = x.max(dim=dim, keepdim=True).values
    empty = m == float("-inf")
    m = m.detach().masked_fill(empty, 0.0)
    s = (x - m).exp().sum(dim=dim, keepdim=True)
    out = s.masked_fill(empty, 1.0).log() + m.masked_fill(empty, float("-inf"))
    return out.squeeze(dim)


def gather_match(emissions: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
    """match[b, t, j] = log P(vertex j emits y_t): emissions (B, Lg, V), tgt (B, T) -> (B, T, Lg)."""
    B, Lg, _ = emissions.shape
    return emissions.gather(-1, tgt[:, None, :].expand(B, Lg, tgt.size(1))).transpose(1, 2)


def dag_logprob(match, links, tlen, glen) -> torch.Tensor:
    """log P(y | x) summed over every path 0 -> glen-1 that emits y: match (B, T, Lg), links (B, Lg, Lg)."""
    B, T, Lg = match.shape
    first = torch.arange(Lg, device=match.device) == 0
    f = match[:, 0].masked_fill(~first, float("-inf"))                     # (B, Lg): y_0 at vertex 0
    fs = [f]
    for t in range(1, T):
        f = logsumexp_safe(f[:, :, None] + links, dim=1) + match[:, t]      # (B, Lg)
        fs.append(f)
    F = torch.stack(fs, dim=1)                                              # (B, T, Lg)
    return F[torch.arange(B), tlen - 1, glen - 1]


@torch.no_grad()
def best_alignment(match, links, tlen, glen) -> torch.Tensor:
    """Viterbi over the same lattice: path[b, t] = the vertex that emits y_t (-1 past the end)."""
    B, T, Lg = match.shape
    f = match[:, 0].masked_fill(torch.arange(Lg) != 0, float("-inf"))
    back = []
    for t in range(1, T):
        f, arg = (f[:, :, None] + links).max(dim=1)                         # (B, Lg)
        f = f + match[:, t]
        back.append(arg)
    path = torch.full((B, T), -1, dtype=torch.long)
    for b in range(B):
        j = int(glen[b]) - 1
        for t in range(int(tlen[b]) - 1, -1, -1):
            path[b, t] = j
            j = int(back[t - 1][b, j]) if t else j
    return path


def glance(dec_in, emissions, tgt, path, tlen, p: float, rng: random.Random):
    """GLAT `number-random`: feed gold words at round((#wrong) * p) random path vertices."""
    dec_in, pred = dec_in.clone(), emissions.argmax(-1)                     # (B, Lg)
    same = total = 0
    for b in range(len(tgt)):
        ts = list(range(1, int(tlen[b]) - 1))                                # words, not BOS/EOS
        ok = sum(int(pred[b, path[b, t]] == tgt[b, t]) for t in ts)
        same, total = same + ok, total + len(ts)
        for t in rng.sample(ts, round((len(ts) - ok) * p)):
            dec_in[b, path[b, t]] = tgt[b, t]
    return dec_in, same / max(total, 1)


# -- training --------------------------------------------------------------------------------------
@dataclass
class TrainConfig:
    minutes: float = 10.0
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 200
    glat_p: tuple[float, float] = (0.5, 0.1)   # annealed linearly over the time budget
    max_steps: int | None = None               # for tests: stop after this many steps
    save_minutes: float = 3.0
    seed: int = 0
    resume: bool = False                       # start from the weights in `out`


def train(task_name: str, out: str | Path, tc: TrainConfig, model_cfg: dict | None = None,
          upsample: float | None = None, log=lambda s: print(s, flush=True)) -> DATransformer:
    torch.manual_seed(tc.seed)
    rng = random.Random(tc.seed)
    task = TASKS[task_name]
    vocab = task.vocab()
    S, lam = task.max_chars + 2, upsample or task.upsample
    cfg = DagConfig(task=task_name, vocab_size=len(vocab), upsample=lam, max_src_len=S,
                    max_vertices=max(2, int(S * lam)), **(model_cfg or {}))
    model, prev = DATransformer(cfg, vocab), 0
    if tc.resume:
        model = load_dag(out).train()                                      # its own config wins
        cfg, prev = model.cfg, json.loads((Path(out) / "config.json").read_text())["train"]["steps"]
        log(f"resumed from {out} after {prev} steps")
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, betas=(0.9, 0.98), weight_decay=0.01)
    log(f"task {task_name}: vocab {len(vocab)}, params {model.num_params():,}, config {asdict(cfg)}")
    t0 = last_save = time.time()
    budget, step = tc.minutes * 60, 0
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1 or (tc.max_steps is not None and step >= tc.max_steps):
            break
        for g in opt.param_groups:
            g["lr"] = tc.lr * min(1.0, (step + 1) / tc.warmup_steps) * max(0.05, 1 - frac)
        p = tc.glat_p[0] + (tc.glat_p[1] - tc.glat_p[0]) * frac
        src, tgt, tlen, glen = make_batch(task, vocab, cfg, rng, tc.batch_size)
        dec_in = model.decoder_input(glen, int(glen.max()))
        model.eval()
        with torch.no_grad():                                               # pass 1: where to glance
            em, links = model(src, dec_in)
            path = best_alignment(gather_match(em, tgt), links, tlen, glen)
        dec_in, glat_acc = glance(dec_in, em, tgt, path, tlen, p, rng)
        model.train()
        em, links = model(src, dec_in)                                      # pass 2: the loss
        logp = dag_logprob(gather_match(em, tgt), links, tlen, glen)
        ok = torch.isfinite(logp)
        loss = -(logp[ok] / tlen[ok]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 50 == 0 or step == 1:
            log(f"step {step} t={time.time() - t0:.0f}s loss/token {loss.item():.4f} "
                f"glat_acc {glat_acc:.3f} p {p:.2f} invalid {int((~ok).sum())}")
        if time.time() - last_save > tc.save_minutes * 60:
            save(model, out, {"train": {**asdict(tc), "steps": prev + step}})
            last_save = time.time()
    save(model, out, {"train": {**asdict(tc), "steps": prev + step,
                                       "wall_s": round(time.time() - t0, 1)}})
    log(f"saved {out} after {step} steps, {time.time() - t0:.0f}s")
    return model.eval()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("task", choices=sorted(TASKS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--glat-p", default="0.5,0.1", help="glancing ratio: start,end (annealed)")
    ap.add_argument("--upsample", type=float, default=None, help="lambda (default: the task's)")
    ap.add_argument("--resume", action="store_true", help="continue from the weights in --out")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    p0, p1 = (float(x) for x in a.glat_p.split(","))
    train(a.task, a.out, TrainConfig(minutes=a.minutes, batch_size=a.batch_size, lr=a.lr,
                                     max_steps=a.max_steps, seed=a.seed, glat_p=(p0, p1),
                                     resume=a.resume),
          upsample=a.upsample)


if __name__ == "__main__":
    main()
