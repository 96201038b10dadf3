"""The heads' training data (speclab/train/heads.py): the text the target wrote, and the target's
hidden states over it, cached once per layer next to the data.

The text is the one the target wrote for `smollm2-draft` (speclab/train/smollm2_data.py: Magpie
chat, code continuations, stdlib windows it read). The target is frozen and runs over it once per
set of layers: the hidden state after each wanted layer (pre-norm, bf16) at every position. Post-
norm features f_t = norm(x_t) and the target's distribution over the trimmed vocabulary
p_t = softmax(f_t W_sub^T) follow from the last layer's x_t without running it again.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from speclab.train.smollm2_data import load_rows, merge

DATA_DIRS = ["~/.cache/speclab/smollm2-draft-data", "~/.cache/speclab/smollm2-draft-data2",
             "~/.cache/speclab/smollm2-draft-data3"]


# ----------------------------------------------------------------------------------------------
# 1. data and features

def load_data(dirs: list[str]) -> dict:
    """Every rows.safetensors / corpus.safetensors found in `dirs`, merged."""
    data = None
    for d in dirs:
        for f in ("rows.safetensors", "corpus.safetensors"):
            p = Path(d).expanduser() / f
            if p.exists():
                data = load_rows(p) if data is None else merge(data, load_rows(p))
    if data is None:
        raise SystemExit(f"no training text in {dirs}: write it first with "
                         "`speclab train smollm2-draft --gen-only` (docs/training.md has the commands)")
    return data


def first_rows(data: dict, n_rows: int) -> dict:
    """The data cut to its first n_rows rows (all of it when n_rows is 0)."""
    if not n_rows:
        return data
    n = int(data["offsets"][n_rows])
    return {k: (v[:n_rows + 1] if k == "offsets" else v[:n_rows] if k == "is_code" else v[:n]) for k, v in data.items()}


class _Enough(Exception):
    """Raised by the hook on the deepest layer wanted: the rest of the forward is not needed."""


@torch.inference_mode()
def target_features(base, data: dict, caches: dict[int, Path], batch_tokens: int = 4096,
                    log=print) -> dict[int, torch.Tensor]:
    """layer -> (sum T, C) bf16: the target's hidden state (pre-norm) after that many layers at
    every token of every row, cached in caches[layer]. The layers not cached yet come from one
    forward per batch of rows (right-padded; causal, so padding never reaches a real token),
    stopped after the deepest of them."""
    from safetensors.torch import load_file, save_file
    off = data["offsets"]
    key = f"{len(data['tokens'])}:{int(data['tokens'].long().sum())}"
    out = {}
    for l, cache in caches.items():
        if cache.exists() and json.loads(cache.with_suffix(".json").read_text()).get("key") == key:
            out[l] = load_file(str(cache))["x"]
    todo = sorted(l for l in caches if l not in out)
    if not todo:
        return out
    from tqdm.auto import tqdm
    n, C = len(data["tokens"]), base.config.hidden_size
    X = {l: torch.empty(n, C, dtype=torch.bfloat16) for l in todo}
    got = {}

    def keeper(l):
        def keep(_m, _i, o):
            got[l] = o[0] if isinstance(o, tuple) else o
            if l == todo[-1]:
                raise _Enough
        return keep
    hooks = [base.model.layers[l - 1].register_forward_hook(keeper(l)) for l in todo]
    rows = sorted(range(len(off) - 1), key=lambda r: int(off[r + 1] - off[r]))
    t0, bar = time.time(), tqdm(total=n, desc=f"target features (layers {todo})", unit="tok", mininterval=5)
    try:
        i = 0
        while i < len(rows):
            L = int(off[rows[i] + 1] - off[rows[i]])
            group = []
            while i < len(rows) and (len(group) + 1) * max(L, int(off[rows[i] + 1] - off[rows[i]])) <= batch_tokens:
                L = max(L, int(off[rows[i] + 1] - off[rows[i]]))
                group.append(rows[i])
                i += 1
            if not group:
                group, i = [rows[i]], i + 1
            L = max(int(off[r + 1] - off[r]) for r in group)
            ids = torch.zeros(len(group), L, dtype=torch.long)
            for j, r in enumerate(group):
                ids[j, :int(off[r + 1] - off[r])] = data["tokens"][int(off[r]):int(off[r + 1])].long()
            try:
                base.model(input_ids=ids.to(base.device))
            except _Enough:
                pass
            for j, r in enumerate(group):
                for l in todo:
                    X[l][int(off[r]):int(off[r + 1])] = got[l][j, :int(off[r + 1] - off[r])].to(torch.bfloat16).cpu()
            bar.update(sum(int(off[r + 1] - off[r]) for r in group))
    finally:
        for h in hooks:
            h.remove()
        bar.close()
    for l in todo:
        cache = caches[l]
        tmp = cache.with_suffix(".tmp")
        save_file({"x": X[l]}, str(tmp))
        tmp.replace(cache)
        cache.with_suffix(".json").write_text(json.dumps({"key": key, "seconds": round(time.time() - t0)}))
    log(f"features: layers {todo}, {n} positions in {time.time() - t0:.0f} s -> {caches[todo[-1]].parent}")
    return out | X


def set_features(base, dirs: list[str], layers: list[int], limit_rows: int = 0) -> dict[int, torch.Tensor]:
    """layer -> (sum T, C): target_features over load_data(dirs), cached in each data directory for
    its own rows, so adding a set to a merged run computes only the new set's features.
    (limit_rows, a quick run over the merged set's first rows: one cache in the first directory.)"""
    L = base.config.num_hidden_layers
    if limit_rows or len(dirs) == 1:
        first = Path(dirs[0]).expanduser()
        data = first_rows(load_data(dirs), limit_rows)
        return target_features(base, data, {l: feature_cache(first, l, L, limit_rows) for l in layers})
    parts = [set_features(base, [d], layers) for d in dirs]          # merge() keeps this order
    return {l: torch.cat([p[l] for p in parts]) for l in layers}


def feature_cache(first: Path, layer: int, n_layers: int, limit_rows: int = 0) -> Path:
    """Where the states after `layer` layers are cached: features.safetensors for the last layer
    (the name earlier heads were trained from), features-l{layer}.safetensors for the others."""
    name = "features" + (f"-l{layer}" if layer != n_layers else "") + (f"-{limit_rows}" if limit_rows else "")
    return first / f"{name}.safetensors"


def windows(data: dict, rows: list[int], T: int) -> list[tuple[int, int]]:
    """Spans of at most T tokens covering the rows (a head needs little context: the target's
    features carry it)."""
    off, out = data["offsets"], []
    for r in rows:
        a, b = int(off[r]), int(off[r + 1])
        out += [(s, min(b, s + T)) for s in range(a, b - 2, T)]
    return out


def batch(data: dict, Xs: list[torch.Tensor], spans, norm, W_sub: torch.Tensor):
    """tokens (B, T), pre-norm states xs [(B, T, C)] at the head's layers (the last layer's last),
    post-norm f (B, T, C) of the last, target log-probs over the subset lp (B, T, N) and a mask
    (B, T) of real positions."""
    T = max(e - s for s, e in spans)
    B, C = len(spans), Xs[0].shape[1]
    tok = torch.zeros(B, T, dtype=torch.long)
    xs = [torch.zeros(B, T, C) for _ in Xs]
    m = torch.zeros(B, T, dtype=torch.bool)
    for i, (s, e) in enumerate(spans):
        tok[i, :e - s] = data["tokens"][s:e].long()
        for x, X in zip(xs, Xs):
            x[i, :e - s] = X[s:e].float()
        m[i, :e - s] = True
    f = norm(xs[-1])
    with torch.no_grad():
        lp = (f @ W_sub.t()).float().log_softmax(-1)
    return tok, xs, f, lp, m
