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
  python -m speclab.train.dag dates --out speclab/zoo/dates-dat --minutes 10 --glat-p 0,0
(dates: glancing made the graph worse within a 10-minute budget; see BENCHMARKS.md)
"""
from __future__ import annotations

import argparse
import datetime
import functools
import itertools
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from speclab.models.dag import BOS, EOS, PAD, SPECIALS, DagConfig, DATransformer, Vocab, save

# -- the toy tasks ---------------------------------------------------------------------------------
ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
MONTHS = "january february march april may june july august september october november december".split()
YEARS = (1950, 2049)


def _ordinal(d: int) -> str:
    return f"{d}{'th' if 10 <= d % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(d % 10, 'th')}"


def _below_1000(n: int) -> list[list[str]]:
    """Every English rendering of 0 < n < 1000: "and" after "hundred" is optional."""
    h, r = divmod(n, 100)
    rest = [] if r == 0 else [ONES[r]] if r < 20 else [TENS[r // 10]] + ([ONES[r % 10]] if r % 10 else [])
    if not h:
        return [rest]
    head = [ONES[h], "hundred"]
    return [head + rest, head + ["and"] + rest] if rest else [head]


def numwords_variants(src: str) -> list[list[str]]:
    n = int(src)
    if n == 0:
        return [["zero"]]
    th, rest = divmod(n, 1000)
    a = [v + ["thousand"] for v in _below_1000(th)] if th else [[]]
    b = _below_1000(rest) if rest else [[]]
    return [x + y for x, y in itertools.product(a, b)]


def dates_variants(src: str) -> list[list[str]]:
    y, m, d = (int(x) for x in src.split("-"))
    month = MONTHS[m - 1]
    return [[str(d), month, str(y)], [month, str(d), str(y)], [str(y), month, str(d)],
            ["the", _ordinal(d), "of", month, str(y)]]


def numwords_parse(text: str) -> str:
    s = text.strip()
    if not s:
        raise ValueError("empty input: give a whole number from 0 to 999999, e.g. 305")
    if not s.isascii() or not s.isdigit():
        raise ValueError(f"numwords takes digits only, got {text!r}: give a whole number from 0 to 999999, e.g. 305")
    if len(s) > 6:
        raise ValueError(f"{text!r} has {len(s)} digits but numwords-dat supports at most 6: "
                         "give a number from 0 to 999999")
    return str(int(s))


def dates_parse(text: str) -> str:
    s = text.strip()
    if not s:
        raise ValueError(f"empty input: give a date as YYYY-MM-DD between {YEARS[0]} and {YEARS[1]}, e.g. 2024-03-05")
    if len(s) > 10:
        raise ValueError(f"{text!r} is longer than the model supports (10 characters): "
                         "give a date as YYYY-MM-DD, e.g. 2024-03-05")
    try:
        d = datetime.date.fromisoformat(s) if len(s) == 10 else None
    except ValueError:
        d = None
    if d is None or not YEARS[0] <= d.year <= YEARS[1]:
        raise ValueError(f"{text!r} is not a date YYYY-MM-DD between {YEARS[0]} and {YEARS[1]}: "
                         "give one like 2024-03-05")
    return d.isoformat()


@functools.lru_cache(maxsize=None)
def _all_dates() -> tuple[str, ...]:
    d0, d1 = datetime.date(YEARS[0], 1, 1), datetime.date(YEARS[1], 12, 31)
    return tuple((d0 + datetime.timedelta(days=i)).isoformat() for i in range((d1 - d0).days + 1))


@functools.lru_cache(maxsize=None)
def heldout(task: str) -> tuple[str, ...]:
    """The fixed held-out inputs of a task (never trained on), in a fixed random order."""
    rng = random.Random(1234)
    if task == "numwords":
        xs = rng.sample(range(100, 10_000), 1000) + rng.sample(range(10_000, 1_000_000), 1500)
        xs = [str(n) for n in xs]
    else:
        xs = rng.sample(_all_dates(), 2000)
    rng.shuffle(xs)
    return tuple(xs)


def _sample_numwords(rng: random.Random) -> str:
    k = rng.randint(1, 6)                              # uniform over digit counts, not over numbers
    return str(rng.randint(0 if k == 1 else 10 ** (k - 1), 10 ** k - 1))


@dataclass(frozen=True)
class Task:
    name: str
    words: tuple[str, ...]             # target vocabulary (source characters are added to it)
    src_chars: str
    max_chars: int
    upsample: float                    # lambda
    parse: Callable[[str], str]        # validate + canonicalise, or raise ValueError
    variants: Callable[[str], list[list[str]]]
    sample: Callable[[random.Random], str]

    def vocab(self) -> Vocab:
        toks = list(SPECIALS)
        for t in list(self.src_chars) + list(self.words):
            if t not in toks:
                toks.append(t)
        return Vocab(toks)


TASKS = {
    "numwords": Task("numwords", tuple(ONES[1:] + TENS[2:] + ["zero", "hundred", "thousand", "and"]),
                     "0123456789", 6, 3.0, numwords_parse, numwords_variants, _sample_numwords),
    "dates": Task("dates", tuple([str(d) for d in range(1, 32)] + [_ordinal(d) for d in range(1, 32)]
                                 + MONTHS + [str(y) for y in range(YEARS[0], YEARS[1] + 1)]
                                 + ["the", "of"]),
                  "0123456789-", 10, 2.0, dates_parse, dates_variants,
                  lambda rng: rng.choice(_all_dates())),
}


def encode_source(task: Task, vocab: Vocab, text: str) -> list[int]:
    """Source text -> [BOS, chars..., EOS] ids (ValueError with what to do on bad input)."""
    return [BOS] + vocab.encode(list(task.parse(text))) + [EOS]


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


def train(task_name: str, out: str | Path, tc: TrainConfig, model_cfg: dict | None = None,
          upsample: float | None = None, log=lambda s: print(s, flush=True)) -> DATransformer:
    torch.manual_seed(tc.seed)
    rng = random.Random(tc.seed)
    task = TASKS[task_name]
    vocab = task.vocab()
    S, lam = task.max_chars + 2, upsample or task.upsample
    cfg = DagConfig(task=task_name, vocab_size=len(vocab), upsample=lam, max_src_len=S,
                    max_vertices=max(2, int(S * lam)), **(model_cfg or {}))
    model = DATransformer(cfg, vocab)
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
            save(model, out, {"train": {**asdict(tc), "steps": step}})
            last_save = time.time()
    save(model, out, {"train": {**asdict(tc), "steps": step,
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
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    p0, p1 = (float(x) for x in a.glat_p.split(","))
    train(a.task, a.out, TrainConfig(minutes=a.minutes, batch_size=a.batch_size, lr=a.lr,
                                     max_steps=a.max_steps, seed=a.seed, glat_p=(p0, p1)),
          upsample=a.upsample)


if __name__ == "__main__":
    main()
