"""Decoding a Directed Acyclic Transformer: from (emissions, links) of one source to one path.

One model forward gives the whole graph: emissions E (Lg, V) and links A (Lg, Lg), both log-probs.
A decoder picks a path 0 = a_1 < a_2 < ... < a_m = Lg-1 and a token at each vertex; the output is the
tokens of the inner vertices with consecutive duplicates collapsed (section B.4 of the note).

  greedy     next = argmax_k A[j, k]                          then the argmax token of k
  lookahead  next = argmax_k A[j, k] + beta * max_c E[k, c]   (beta scales emissions, as the code does)
  viterbi    joint Viterbi: argmax over paths of (sum A + sum max E) / m ** viterbi_beta
  sample     draw (k, c) from the top-k pairs of log_softmax(A[j] / T)[k] + beta * E[k, c], top-p cut
  beam       prefix beam over vertices in topological order; paths giving the same prefix are merged
             (log-add), as in DAG-Search
  vanilla    no graph: most likely length, then each position's own argmax -- the multimodality failure

`run_dag` runs one or all of them on a source text and records a Trace(engine="dag").
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import torch

from speclab.models.dag import PAD, BOS, EOS, UNK, DATransformer
from speclab.models.dag_tasks import TASKS, encode_source
from speclab.trace import DagRun, ModelInfo, Sampling, Totals, Trace

STRATEGIES = ("greedy", "lookahead", "viterbi", "sample", "beam", "vanilla")
SPECIAL_IDS = (PAD, BOS, EOS, UNK)


@dataclass
class DecodeConfig:
    beta: float = 1.0            # weight of the emission log-prob (lookahead, sample, beam)
    viterbi_beta: float = 1.0    # length normalisation exponent of Viterbi
    temperature: float = 1.0     # sampling: on the links, as in the reference
    top_k: int = 5               # sampling / beam: candidate (vertex, token) pairs per step
    top_p: float = 0.9           # sampling / beam: probability-mass cut over the candidates
    beam_size: int = 20
    beam_alpha: float = 1.1      # beam length normalisation exponent

    def __post_init__(self):
        for name in ("top_k", "beam_size"):         # sizes: they slice and take top-k
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


def decode_config(model, **settings) -> DecodeConfig:
    """The decoder settings for `model`: the defaults above, then those its config.json tunes for
    it ("decode", e.g. dates-dat's viterbi_beta), then the caller's `settings`."""
    return DecodeConfig(**{**getattr(model, "decode_defaults", {}), **settings})


def collapse(tokens: list[int], dedup: bool = True) -> list[int]:
    """Drop special tokens and consecutive duplicates: the DAG output rule (vanilla: no dedup)."""
    out = []
    for t in tokens:
        if t not in SPECIAL_IDS and (not dedup or not out or out[-1] != t):
            out.append(t)
    return out


def output_of(name: str, toks: list[int]) -> list[int]:
    """A decoder's output ids: the inner vertices' tokens (not BOS/EOS), collapsed."""
    return collapse(toks[1:-1], dedup=name != "vanilla")


# -- decoders: (E (Lg, V), A (Lg, Lg), cfg, generator) -> (vertex path, token at each path vertex) --
def greedy(E, A, cfg, g=None):
    return _walk(E, A, torch.zeros(E.size(0)))


def lookahead(E, A, cfg, g=None):
    return _walk(E, A, cfg.beta * E.max(-1).values)


def _walk(E, A, bonus):
    Lg, path = E.size(0), [0]
    while path[-1] != Lg - 1:
        path.append(int((A[path[-1]] + bonus).argmax()))
    return path, E.argmax(-1)[path].tolist()


def viterbi(E, A, cfg, g=None):
    """Joint Viterbi (Shao et al. 2022): best path by (sum of links + emissions) / m ** viterbi_beta."""
    Lg = E.size(0)
    e = E.max(-1).values                                          # (Lg,)
    a = torch.full((Lg,), float("-inf"))
    a[0] = e[0]                                                   # best 1-vertex path ending at j
    backs, best, best_m = [], float("-inf"), 0
    for m in range(2, Lg + 1):                                    # paths of m vertices
        s, bp = (a[:, None] + A).max(dim=0)                       # (Lg,)
        a = s + e
        backs.append(bp)
        score = float(a[-1]) / m ** cfg.viterbi_beta
        if score > best:
            best, best_m = score, m
    path = [Lg - 1]
    for bp in reversed(backs[: best_m - 1]):
        path.append(int(bp[path[-1]]))
    path = path[::-1]
    return path, E.argmax(-1)[path].tolist()


def _candidates(E, A, j, cfg, link_temp=1.0):
    """Top-k (next vertex k, token c, score) pairs out of vertex j, best first."""
    Lg = E.size(0)
    links = torch.log_softmax(A[j] / link_temp, dim=-1) if link_temp != 1.0 else A[j]
    topE, topc = E.topk(min(cfg.top_k, E.size(1)), dim=-1)       # (Lg, K)
    s = links[:, None] + cfg.beta * topE                          # (Lg, K)
    s[Lg - 1, 1:] = float("-inf")                                 # the EOS vertex emits only once
    flat = s.flatten()
    vals, idx = flat.topk(min(cfg.top_k, int(torch.isfinite(flat).sum())))
    K = topE.size(1)
    return [(int(i) // K, int(topc[int(i) // K, int(i) % K]), float(v)) for v, i in zip(vals, idx)]


def sample(E, A, cfg, g=None):
    """Sampling (B.4.5): draw the next (vertex, token) pair from the top-k / top-p candidates."""
    Lg, path, toks = E.size(0), [0], [int(E[0].argmax())]
    if cfg.temperature <= 0:
        return lookahead(E, A, cfg)
    while path[-1] != Lg - 1:
        cand = _candidates(E, A, path[-1], cfg, link_temp=cfg.temperature)
        w, acc = [], 0.0
        for _, _, s in cand:                                      # nucleus: include the crossing one
            w.append(math.exp(s))
            acc += w[-1]
            if acc > cfg.top_p:
                break
        i = int(torch.multinomial(torch.tensor(w), 1, generator=g))
        path.append(cand[i][0])
        toks.append(cand[i][1])
    return path, toks


def beam(E, A, cfg, g=None):
    """Prefix beam search (DAG-Search without LM): at[v][prefix] = log-add of every path that ends at
    vertex v having produced `prefix`; each prefix also keeps its single best path for display."""
    Lg = E.size(0)
    at = [dict() for _ in range(Lg)]           # v -> {prefix: [logp, best path score, best path]}
    at[0][()] = [0.0, 0.0, [0]]
    norm = lambda prefix, lp: lp / (len(prefix) + 1) ** cfg.beam_alpha
    for v in range(Lg - 1):
        if not at[v]:
            continue
        beams = sorted(at[v].items(), key=lambda kv: -norm(kv[0], kv[1][0]))[: cfg.beam_size]
        cand = _candidates(E, A, v, cfg)
        for prefix, (lp, bs, bpath) in beams:
            acc = 0.0
            for k, c, s in cand:
                if acc >= cfg.top_p:
                    break
                acc += math.exp(s)
                child = prefix if k == Lg - 1 or (prefix and prefix[-1] == c) else prefix + (c,)
                old = at[k].get(child)
                if old is None:
                    at[k][child] = [lp + s, bs + s, bpath + [k]]
                else:
                    old[0] = float(torch.logaddexp(torch.tensor(old[0]), torch.tensor(lp + s)))
                    if bs + s > old[1]:
                        old[1], old[2] = bs + s, bpath + [k]
        at[v] = {}                                                # done with v: free it
    if not at[Lg - 1]:                                            # nothing survived the cuts
        return lookahead(E, A, cfg)
    prefix, (_, _, path) = max(at[Lg - 1].items(), key=lambda kv: norm(kv[0], kv[1][0]))
    return path, [BOS] + list(prefix) + [EOS]


def vanilla(E, A, cfg, g=None):
    """What a vanilla NAT decodes: the most likely length m, then at every position n on its own the
    argmax of P(token at n | length m), marginal over all paths of m vertices (a NAT trained with
    cross-entropy learns exactly these marginals). Variants of the same length that disagree get
    mixed position by position ("march march 2024"). Consecutive repeats are kept, not collapsed.
    The path is the most likely vertex at each position (kept increasing), for display only."""
    Lg = E.size(0)
    T = A.exp()                                                   # (Lg, Lg) transition probabilities
    f = [torch.zeros(Lg)]                                         # f[n][j] = P(n-th vertex is j)
    f[0][0] = 1.0
    for _ in range(Lg - 1):
        f.append(f[-1] @ T)
    hops = int(torch.stack([x[-1] for x in f]).argmax())          # most likely length: hops + 1 vertices
    b = [torch.zeros(Lg)]                                         # b[k][j] = P(reach Lg-1 in k hops)
    b[0][-1] = 1.0
    for _ in range(hops):
        b.append(T @ b[-1])
    P = E.exp()                                                   # (Lg, V)
    path, toks = [0], [BOS]
    for n in range(1, hops):
        w = f[n] * b[hops - n]                                    # P(n-th vertex = j, length) (Lg,)
        toks.append(int((w @ P).argmax()))
        lo, hi = path[-1] + 1, Lg - 1 - (hops - n)
        path.append(lo + int(w[lo:hi + 1].argmax()))
    return path + [Lg - 1], toks + [EOS]


DECODERS = dict(greedy=greedy, lookahead=lookahead, viterbi=viterbi, sample=sample, beam=beam,
                vanilla=vanilla)


# -- graph summaries for the trace ------------------------------------------------------------------
def pass_prob(A: torch.Tensor) -> torch.Tensor:
    """P(a random walk from vertex 0 visits j) = sum_i P(i) * exp(A[i, j]); the DAG visits j at most once."""
    P = torch.zeros(A.size(0))
    P[0] = 1.0
    T = A.exp()                                                   # (Lg, Lg), exp(-inf) = 0
    for j in range(1, A.size(0)):
        P[j] = (P[:j] * T[:j, j]).sum()
    return P


def _topk_rows(X: torch.Tensor, k: int) -> list[list[list[float]]]:
    p, i = X.exp().topk(min(k, X.size(1)), dim=-1)
    return [[[int(a), round(float(b), 5)] for a, b in zip(ri, rp) if b > 0] for ri, rp in zip(i, p)]


# -- the run ----------------------------------------------------------------------------------------
@torch.no_grad()
def forward_graph(model: DATransformer, src_ids: list[int]):
    """One model forward: (E (Lg, V), A (Lg, Lg)) for one source, on CPU in fp32."""
    device = next(model.parameters()).device
    Lg = model.cfg.num_vertices(len(src_ids))
    src = torch.tensor([src_ids], device=device)
    E, A = model(src, model.decoder_input(torch.tensor([Lg], device=device), Lg))
    return E[0].float().cpu(), A[0].float().cpu()


def encode(model: DATransformer, source_text: str) -> list[int]:
    """Validate and encode a source; ValueError saying what to do on bad input."""
    if not isinstance(source_text, str):
        raise ValueError(f"source must be a string, got {type(source_text).__name__}")
    ids = encode_source(TASKS[model.cfg.task], model.vocab, source_text)
    if len(ids) > model.cfg.max_src_len:
        raise ValueError(f"input {source_text!r} is longer than {model.name} supports "
                         f"({model.cfg.max_src_len - 2} characters); shorten it")
    return ids


def decode_text(model_or_vocab, ids) -> str:
    """Output token ids -> text ("three hundred and five", "march 5 2024")."""
    vocab = getattr(model_or_vocab, "vocab", model_or_vocab)
    return " ".join(vocab.decode(collapse(list(ids), dedup=False)))


def run_dag(model: DATransformer, source_text: str, strategy: str = "viterbi",
            record: str | None = "light", seed: int = 0, cfg: DecodeConfig | None = None) -> Trace:
    """Decode `source_text` with one strategy (or "all": every strategy on the same graph, `chosen`
    = viterbi) and return the Trace; `speclab.trace.replay(trace)` gives `trace.output_ids`."""
    if strategy not in STRATEGIES + ("all",):
        raise ValueError(f"unknown DAG strategy {strategy!r}; choose one of {', '.join(STRATEGIES)} or all")
    if record not in (None, "light", "full"):
        raise ValueError(f"record must be None, 'light' or 'full', got {record!r}")
    cfg = cfg or decode_config(model)
    src_ids = encode(model, source_text)
    t0 = time.perf_counter()
    E, A = forward_graph(model, src_ids)
    g = torch.Generator().manual_seed(seed)                       # one seeded generator per run
    names = STRATEGIES if strategy == "all" else (strategy,)
    paths, outputs = {}, {}
    for name in names:
        paths[name], toks = DECODERS[name](E, A, cfg, g)
        outputs[name] = output_of(name, toks)
    chosen = "viterbi" if strategy == "all" else strategy
    wall = time.perf_counter() - t0

    Lg = E.size(0)
    task = TASKS[model.cfg.task]        # a DAG is judged on its own terms: is the output a right answer?
    right = task.variants(task.parse(source_text))
    valid = {name: model.vocab.decode(collapse(list(out), dedup=False)) in right for name, out in outputs.items()}
    run = DagRun(num_vertices=Lg, paths=paths, outputs=outputs, chosen=chosen, valid=valid)
    if record is not None:
        k = 5 if record == "full" else 2
        run.emissions_topk = _topk_rows(E, k)
        run.links_topk = _topk_rows(A, k + 1)
        run.pass_prob = [round(float(p), 5) for p in pass_prob(A)]
    ids = set(src_ids) | {t for o in outputs.values() for t in o}
    ids |= {int(t) for row in run.emissions_topk for t, _ in row}
    info = ModelInfo(name=model.name, params=model.num_params(),
                     dtype=str(next(model.parameters()).dtype).replace("torch.", ""),
                     device=str(next(model.parameters()).device))
    return Trace(
        engine="dag", method=f"dag-{strategy}", record=record,
        params={"task": model.cfg.task, "upsample": model.cfg.upsample, **asdict(cfg)},
        models={"target": info},
        sampling=Sampling(temperature=cfg.temperature if "sample" in names else 0.0,
                          top_k=cfg.top_k if "sample" in names else None,
                          top_p=cfg.top_p if "sample" in names else None, seed=seed),
        prompt_ids=src_ids, output_ids=list(outputs[chosen]),
        token_text={i: model.vocab.itos[i] for i in sorted(ids)},
        totals=Totals(wall_s=wall, target_forwards=1, new_tokens=len(outputs[chosen])),
        dag=run)
