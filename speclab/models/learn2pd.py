"""Learn2PD's filter ("Learning to Parallel Decode", code ims-kdks/Learning-to-Parallel-Decoding):
a tiny MLP that reads, per masked position of the active block, what one denoising step tells
about it, and gives two probabilities:

    final   the position's current proposal x0 already equals the token one-token-per-step
            decoding finally commits there (commit it now)
    end     the position proposes end of text and the answer really ends here or earlier
            (commit the end of text; nothing after it needs decoding)

The paper's filter reads the vector of the block's 32 top-1 confidences and gives 32 logits; this
one reads per position a few features (FEATURES) that carry the same neighbourhood, so it works at
any block length:

    conf       p(x0)                              margin     l1 - l2 / 10, at most 3
    entropy    entropy / 5 nats, at most 2        stable     steps x0 has stayed the same / 8, at most 1
    rel_pos    (position - block start) / B       gap        distance to the nearest committed slot on
    filled     share of the block committed                  the left (the prompt counts) / 16, at most 1
    left_conf  p(x0) of the left neighbour        right_conf p(x0) of the right neighbour
               (1 committed or the prompt)                   (1 committed, 0 past the block)
    is_eos     x0 is end of text                  after_eos  an end of text is proposed at a masked
                                                             slot of the block to the left

    h = ReLU(W2 ReLU(W1 f + b1) + b2);  [final, end] = sigmoid(W3 h + b3)

A filter is a directory: `learn2pd.json` (`speclab_learn2pd`: the dLLM it was trained for, the
widths, the features, how its labels were made, its held-out evaluation) and `learn2pd.safetensors`
(fp32, written beside its name and renamed into place). No config.json, so the zoo does not list it
as a model; the policy finds the zoo's filter for its dLLM with `paired_filter`.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from speclab.models.parts import paired_part, read_part, save_part

KEY = "speclab_learn2pd"
CONFIG, WEIGHTS = "learn2pd.json", "learn2pd.safetensors"
FEATURES = ("conf", "margin", "entropy", "stable", "rel_pos", "gap", "filled", "left_conf", "right_conf",
            "is_eos", "after_eos")


class Learn2PDFilter(nn.Module):
    def __init__(self, n_features: int = len(FEATURES), hidden: int = 32):
        super().__init__()
        self.n_features, self.hidden = n_features, hidden
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, 2))

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        """Logits (..., 2) [final, end] from features (..., n_features)."""
        return self.net(f.float())

    @torch.no_grad()
    def scores(self, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.forward(f).sigmoid()
        return p[..., 0], p[..., 1]


class Stability:
    """Per generation slot: how many consecutive steps its proposal x0 has stayed the same (1 the
    step it changes or first shows). A committed slot restarts at 0."""

    def __init__(self, G: int):
        self.count = torch.zeros(G, dtype=torch.long)
        self.last = torch.full((G,), -1, dtype=torch.long)

    def update(self, x0: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        x0, masked = x0.cpu(), masked.cpu()
        same = masked & (self.last == x0)
        self.count = torch.where(same, self.count + 1, torch.where(masked, torch.ones_like(self.count), 0))
        self.last = torch.where(masked, x0, torch.full_like(self.last, -1))
        return self.count.clone()


def features(conf: torch.Tensor, logit_margin: torch.Tensor, entropy: torch.Tensor | None, stable: torch.Tensor,
             masked: torch.Tensor, x0: torch.Tensor, block: tuple[int, int], eos_id: int | None) -> torch.Tensor:
    """(B, len(FEATURES)) float32 for the B slots of the active block [lo, hi) (generation
    coordinates; every argument is per generation slot, (G,)). Committed slots get rows too (the
    policy reads only the masked ones)."""
    lo, hi = block
    B = hi - lo
    conf, masked = conf[lo:hi].float().cpu(), masked[lo:hi].cpu()
    lm = logit_margin[lo:hi].float().cpu()
    ent = entropy[lo:hi].float().cpu() if entropy is not None else torch.zeros(B)
    x0 = x0[lo:hi].cpu()
    c1 = torch.where(masked, conf, torch.ones_like(conf))            # a committed slot is certain
    left = torch.cat([torch.ones(1), c1[:-1]])
    right = torch.cat([c1[1:], torch.zeros(1)])
    idx = torch.arange(B)
    # the nearest committed slot on the left: slot lo - 1 is committed (an earlier block or the prompt)
    done = torch.where(~masked, idx, torch.full_like(idx, -1))
    last = torch.cummax(done, 0).values
    prev = torch.cat([torch.full((1,), -1), last[:-1]])              # strictly to the left
    gap = (idx - prev).float()
    eos = (x0 == eos_id) if eos_id is not None else torch.zeros(B, dtype=torch.bool)
    eos_m = (eos & masked).long()
    after = (torch.cumsum(eos_m, 0) - eos_m) > 0
    return torch.stack([
        conf, (lm / 10).clamp(0, 3), (ent / 5).clamp(0, 2), (stable[lo:hi].float().cpu() / 8).clamp(max=1),
        idx.float() / B, (gap / 16).clamp(max=1), (~masked).float().mean().expand(B),
        left, right, eos.float(), after.float()], -1)


def save_filter(model: Learn2PDFilter, out: str | Path, meta: dict) -> Path:
    """Write learn2pd.safetensors and learn2pd.json into `out`, each beside its name first."""
    return save_part(model, out, CONFIG, WEIGHTS, KEY,
                     {"n_features": model.n_features, "hidden": model.hidden, "features": list(FEATURES), **meta})


def filter_info(where: str | Path) -> dict:
    info = read_part(where, CONFIG, KEY, f"{where} holds no Learn2PD filter ({CONFIG}): train one with "
                                         "`speclab train learn2pd` (docs/training.md)")
    if info.get("features") != list(FEATURES):
        raise ValueError(f"the filter in {where} reads features {info.get('features')}, this speclab computes "
                         f"{list(FEATURES)}: retrain it with `speclab train learn2pd`")
    return info


def load_filter(where: str | Path) -> Learn2PDFilter:
    """The filter in directory `where` (fp32, eval mode, on the CPU: it is a few thousand weights)."""
    from safetensors.torch import load_file
    info = filter_info(where)
    model = Learn2PDFilter(info["n_features"], info["hidden"])
    model.load_state_dict(load_file(str(Path(where) / WEIGHTS)))
    return model.eval()


def paired_filter(dllm_name: str | None) -> Path | None:
    """The zoo's filter trained for the dLLM named `dllm_name` (its zoo name or path), or None."""
    return paired_part(CONFIG, KEY, "dllm", dllm_name)


def resolve_filter(where: str | None, dllm_name: str | None) -> Path:
    """A filter directory: `where` (a directory or a zoo name), else the zoo's filter for the dLLM."""
    from speclab.models.zoo import zoo_path
    if where is not None:
        for p in (Path(where), zoo_path(where, CONFIG)):
            if p is not None and (p / CONFIG).is_file():
                return p
        raise ValueError(f"filter={where!r} is not a Learn2PD filter directory or zoo name: pass the --out of "
                         f"`speclab train learn2pd` (docs/training.md)")
    p = paired_filter(dllm_name)
    if p is None:
        raise ValueError(f"the zoo has no Learn2PD filter for {dllm_name!r}: train one with `speclab train learn2pd "
                         f"--dllm {Path(str(dllm_name)).name} --out DIR` and pass filter=DIR")
    return p
