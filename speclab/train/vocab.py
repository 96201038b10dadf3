"""The trimmed vocabulary of a draft or a head: the ids it scores, most frequent first, shared by
the draft-model trainer (smollm2_draft.py) and the head trainers (heads.py, eagle3.py).
"""
from __future__ import annotations

import torch


def select_head_ids(tokens: torch.Tensor, n: int, always: list[int], vocab_size: int,
                    counts: torch.Tensor | None = None, fill: bool = False) -> torch.Tensor:
    """The `n` most frequent ids of `tokens` (or of precomputed `counts`), most frequent first;
    `always` are kept in any case (they take the places of the least frequent ones).

    fill: top up to `n` with the lowest unseen ids. A BPE vocabulary is numbered in merge order, so
    low ids are the tokens frequent in the tokenizer's own corpus: with ~100 chat rows, a held-out
    answer's words are often unseen ones, and the low ids cover more of them than nothing does.
    """
    if counts is None:
        counts = torch.bincount(tokens.long().flatten(), minlength=vocab_size)
    order = torch.argsort(counts, descending=True, stable=True)
    order = order[counts[order] > 0]
    keep = [i for i in order.tolist() if i not in set(always)][:max(0, n - len(always))]
    ranked = sorted(set(always) | set(keep), key=lambda i: (-float(counts[i]), i))
    if fill and len(ranked) < n:
        have = set(ranked)
        ranked += [i for i in range(vocab_size) if i not in have][:n - len(ranked)]
    return torch.tensor(ranked, dtype=torch.long)


def coverage(tokens: torch.Tensor, head_ids: torch.Tensor) -> float:
    """Share of `tokens` inside the subset."""
    inside = torch.isin(tokens.long(), head_ids)
    return float(inside.float().mean()) if len(tokens) else float("nan")


def subset_index(head_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(V,) position of each token id in the subset, -1 outside it."""
    idx = torch.full((vocab_size,), -1, dtype=torch.long)
    idx[head_ids] = torch.arange(len(head_ids))
    return idx


def text_head_ids(tok, data: dict, rows: list[int], size: int, V: int) -> torch.Tensor:
    """A trimmed head's ids for a head trained on `rows` of head_data's text: the chat specials,
    then the ids the text uses most, `size` in all (at most V)."""
    specials = [i for i in tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
                if i is not None and i != tok.unk_token_id]
    pos = torch.cat([torch.arange(int(data["offsets"][r]), int(data["offsets"][r + 1])) for r in rows])
    counts = torch.bincount(data["tokens"][pos].long(), minlength=V).float()
    return select_head_ids(None, min(size, V), specials, V, counts=counts, fill=True)



# -- the coverage-vs-latency search (Ben Shoham 2026, arXiv 2603.05210) --------------------------
# `speclab train vocab`: the size N of a draft's trimmed vocabulary, its N most frequent ids, searched
# with optuna's TPESampler. The paper's own utility, search space and defaults were not found (only
# its abstract): the utility, the latency model's form and every default below are speclab's.
#
#   coverage(N)  share of the assistant-response tokens among the N kept ids
#   latency(N)   the draft's cost per drafted token: fixed + per_id * N, from the draft's FLOPs
#                (2 x its layers' weights + 2 x hidden x N for the head's rows) or fitted to its
#                measured forward at a few N (latency="measured")
#   maximise     coverage(N) - weight * latency(N) / latency(N_max)   subject to coverage(N) >= min_coverage
# A frequency-ranked vocabulary's coverage rises with N, so the constraint alone would be met by
# the smallest N passing it; the weight trades coverage above the floor against latency.

OPTUNA_MISSING = "the vocabulary search needs optuna: pip install 'speclab[train]' (or pip install optuna)"


def token_ranks(tokens: torch.Tensor, order: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Each token's place in `order` (ids most frequent first; len(order) for ids outside it), sorted:
    coverage(N) is then the share of these ranks below N."""
    rank = torch.full((vocab_size,), len(order), dtype=torch.long)
    rank[order.long()] = torch.arange(len(order))
    return torch.sort(rank[tokens.long().flatten()]).values


def prefix_coverage(ranks: torch.Tensor, n: int) -> float:
    """Share of tokens inside the first n ids of the order (`ranks` from token_ranks)."""
    return float(torch.searchsorted(ranks, torch.tensor(n), side="left")) / max(len(ranks), 1)


class Latency:
    """A draft's cost per drafted token as fixed + per_id * N (unit: GFLOPs or ms)."""

    def __init__(self, fixed: float, per_id: float, unit: str, how: str):
        self.fixed, self.per_id, self.unit, self.how = fixed, per_id, unit, how

    def __call__(self, n: int) -> float:
        return self.fixed + self.per_id * n

    def as_dict(self) -> dict:
        return {"fixed": self.fixed, "per_id": self.per_id, "unit": self.unit, "how": self.how}


def flops_latency(config) -> Latency:
    """Forward FLOPs of one drafted token (a Llama config): 2 x the layers' weights (attention's
    q, k, v, o and the gated MLP) + 2 x hidden per head row; attention over the context left out."""
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    hd = getattr(config, "head_dim", None) or H // config.num_attention_heads
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    layer = H * q + 2 * H * kv + q * H + 3 * H * I
    return Latency(2 * L * layer / 1e9, 2 * H / 1e9, "GFLOPs", "flops")


@torch.inference_mode()
def measured_latency(draft, head_weight: torch.Tensor, sizes: list[int], context: int = 64,
                     repeats: int = 20) -> Latency:
    """fixed + per_id * N fitted (least squares) to the draft's measured time for one token: its
    layers over a cache of `context` tokens, then its head's first N rows, at each of `sizes`."""
    import time
    dev = head_weight.device
    ids = torch.randint(0, draft.config.vocab_size, (1, context), device=dev)
    out = draft.model(input_ids=ids, use_cache=True)
    nxt = ids[:, -1:]

    def once(n):
        h = draft.model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True).last_hidden_state[0, -1]
        out.past_key_values.crop(-1)                 # drop the token just run: the cache is `context` again
        return h @ head_weight[:n].t()
    times = []
    for n in sizes:
        once(n)
        t0 = time.perf_counter()
        for _ in range(repeats):
            once(n)
        times.append((time.perf_counter() - t0) / repeats * 1e3)
    X = torch.tensor([[1.0, float(n)] for n in sizes], dtype=torch.float64)
    a, b = torch.linalg.lstsq(X, torch.tensor(times, dtype=torch.float64).unsqueeze(1)).solution.flatten().tolist()
    return Latency(a, max(b, 0.0), "ms", f"measured at N = {sizes}: {[round(t, 3) for t in times]} ms")


def search_vocab_size(ranks: torch.Tensor, latency: Latency, min_coverage: float, n_min: int, n_max: int,
                      trials: int = 40, weight: float = 1.0, seed: int = 0) -> dict:
    """The vocabulary size N in [n_min, n_max] (TPE over log N) maximising coverage - weight *
    latency / latency(n_max) among the sizes tried whose coverage is >= min_coverage. The first
    trial is n_max (the whole vocabulary there is). Returns the chosen size, its coverage,
    latency and utility, and every trial."""
    try:
        import optuna
    except ImportError:
        raise ImportError(OPTUNA_MISSING) from None
    if not 0 < min_coverage <= 1:
        raise ValueError(f"min_coverage must be in (0, 1], got {min_coverage}")
    if not 1 <= n_min <= n_max:
        raise ValueError(f"the vocabulary sizes must satisfy 1 <= n_min <= n_max, got {n_min}, {n_max}")
    top = prefix_coverage(ranks, n_max)
    if top < min_coverage:
        raise ValueError(f"even {n_max} ids cover only {top:.4f} of the tokens, under min_coverage "
                         f"{min_coverage}: lower --min-coverage or give a draft with a larger vocabulary")
    full = latency(n_max)

    def objective(trial):
        n = trial.suggest_int("size", n_min, n_max, log=True)
        cov = prefix_coverage(ranks, n)
        trial.set_user_attr("coverage", cov)
        shortfall = min_coverage - cov                           # <= 0: the constraint holds
        trial.set_user_attr("shortfall", shortfall)
        if hasattr(trial, "set_constraint"):                     # optuna >= 5
            trial.set_constraint("coverage shortfall", shortfall)
        return cov - weight * latency(n) / full

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    constrained = {} if hasattr(optuna.trial.Trial, "set_constraint") else \
        {"constraints_func": lambda t: [t.user_attrs["shortfall"]]}
    sampler = optuna.samplers.TPESampler(seed=seed, **constrained)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({"size": n_max})
    study.optimize(objective, n_trials=trials)
    rows = [{"size": t.params["size"], "coverage": round(t.user_attrs["coverage"], 5),
             "latency": round(latency(t.params["size"]), 6), "utility": round(t.value, 6),
             "feasible": t.user_attrs["shortfall"] <= 0} for t in study.trials]
    best = max((r for r in rows if r["feasible"]), key=lambda r: (r["utility"], -r["size"]))
    return {**best, "min_coverage": min_coverage, "weight": weight, "latency_model": latency.as_dict(),
            "latency_full": full, "n_range": [n_min, n_max], "trials": rows}


def get_args(argv=None):
    import argparse
    ap = argparse.ArgumentParser(
        prog="speclab train vocab",
        description="Search a draft's vocabulary size: coverage of the target's answers against the draft's "
                    "latency, with optuna's TPE under a minimum coverage (needs optuna: pip install "
                    "'speclab[train]'). The kept ids are the draft's trimmed head's first N (most frequent "
                    "first), or for a full-vocabulary draft the answers' N most frequent ids.")
    ap.add_argument("--draft", required=True, help="the draft: a zoo name or directory (smollm2-draft)")
    ap.add_argument("--target", default=None, help="the model whose answers are covered (default: the draft's base)")
    ap.add_argument("--prompts", default="chat-dev,category-chat,category-coding,category-writing,category-qa",
                    help="prompt sets the target answers (its greedy answers are the assistant responses)")
    ap.add_argument("--limit", type=int, default=None, help="prompts per set (default: all)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--min-coverage", type=float, default=0.85,
                    help="the floor on coverage (the shipped smollm2-draft covers 0.91 of its target's answers)")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--weight", type=float, default=1.0, help="latency's weight in the utility")
    ap.add_argument("--latency", choices=("flops", "measured"), default="flops")
    ap.add_argument("--n-min", type=int, default=64, help="smallest size tried (speclab's trimmed head: 64)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--answers", default=None, help="a .safetensors file keeping the answers' tokens: read "
                                                    "if it exists (the target is not run), written if not")
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--save", default=None, help="write the draft with its head cut to the chosen size here "
                                                 "(a trimmed-head draft such as smollm2-draft)")
    return ap.parse_args(argv)


def answer_tokens(target, prompts: str, limit: int | None, tokens: int) -> torch.Tensor:
    """The target's greedy answers (the assistant responses) to every prompt of the sets, concatenated."""
    from speclab.train.dev_eval import answers
    out = []
    for name in prompts.split(","):
        out += [a.tokens[a.first:] for a in answers(*target, name.strip(), limit=limit, tokens=tokens)]
    return torch.cat(out)


def main(argv=None):
    import json
    from pathlib import Path
    from speclab.models import zoo
    from speclab.models.adapter import adapter_info
    args = get_args(argv)
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise SystemExit(OPTUNA_MISSING)
    draft, _ = zoo.load(args.draft, dtype="fp32")
    target_name = args.target or (adapter_info(zoo.resolve(args.draft)) or {}).get("base")
    if target_name is None:
        raise SystemExit(f"{args.draft} names no base model: give --target")
    target = None if args.answers and Path(args.answers).exists() else zoo.load(target_name)
    V = draft.config.vocab_size
    if args.answers and Path(args.answers).exists():
        from safetensors.torch import load_file
        toks = load_file(args.answers)["tokens"]
    else:
        toks = answer_tokens(target, args.prompts, args.limit, args.max_new_tokens)
        if args.answers:
            from safetensors.torch import save_file
            save_file({"tokens": toks.contiguous()}, args.answers)
    head = draft.lm_head
    order = getattr(head, "head_ids", None)
    if order is None:                                     # a full-vocabulary draft: the answers' ranking
        order = select_head_ids(toks, V, [], V, fill=True)
    ranks = token_ranks(toks, order, V)
    if args.latency == "flops":
        lat = flops_latency(draft.config)
    else:
        n_max = len(order)
        sizes = sorted({max(args.n_min, n_max // d) for d in (16, 8, 4, 2, 1)})
        lat = measured_latency(draft, head.weight if hasattr(head, "head_ids") else head.weight[order], sizes)
    res = search_vocab_size(ranks, lat, args.min_coverage, args.n_min, len(order), args.trials, args.weight, args.seed)
    res.update(draft=args.draft, target=target_name, prompts=args.prompts, answer_tokens=len(toks),
               coverage_full=round(prefix_coverage(ranks, len(order)), 5))
    print(f"vocab: {res['size']} of {len(order)} ids, coverage {res['coverage']:.4f} (all {len(order)}: "
          f"{res['coverage_full']:.4f}, floor {args.min_coverage}), latency {res['latency']:.4g} {lat.unit} "
          f"against {res['latency_full']:.4g} ({len(toks)} answer tokens, {args.trials} trials)")
    if args.save:
        if getattr(head, "head_ids", None) is None:
            raise SystemExit(f"--save cuts a trimmed head; {args.draft} scores the whole vocabulary "
                             f"(run it with draft-model[vocab=...] instead)")
        save_trimmed(zoo.resolve(args.draft), args.save, res["size"])
        res["saved"] = args.save
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    return 0


def save_trimmed(src, dst, n: int):
    """Copy the trimmed-head draft directory `src` to `dst` with its head_ids cut to the first n."""
    import shutil
    from pathlib import Path
    from safetensors.torch import load_file, save_file
    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy2(f, dst / f.name)
    sd = load_file(str(src / "model.safetensors"))
    sd["head_ids"] = sd["head_ids"][:n].contiguous()
    save_file(sd, str(dst / "model.safetensors"), metadata={"format": "pt"})
