"""SpecKV: a small model over the draft's confidence and entropy picks each round's draft length.

SpecKV (Shukla 2026, "SpecKV: Adaptive Speculative Decoding with Compression-Aware Gamma Selection";
+56.0% tokens a step over a fixed gamma = 4, 0.34 ms a decision): a 16-unit MLP reads draft-side
signals (the draft's entropy and confidence, their extremes over the step, the compression level and
a candidate gamma), predicts the acceptance rate, and the step takes the gamma of gamma in {2, 4, 6,
8} with the most expected tokens. speclab's reading, per round:

    read     the draft's first forward of the round gives q_1 (softmax of its logits, T = 1):
             confidence c = max q_1, entropy H = -sum q_1 log q_1 (nats)
    predict  LengthModel: (c, H) -> P(the first j draft tokens are all accepted), j = 1..G, an
             MLP 2 -> 16 -> G, sigmoid outputs made non-increasing in j (cummin)
    choose   gamma = argmax over 1..max_k of  (1 + sum_{j <= gamma} P_j) / (1 + gamma * cost):
             expected tokens (the bonus counted) over the round's cost in `ar` steps, `cost` being
             one more draft token's price (its draft forward and its verify row), measured by the
             trainer on the runs it fit on
    verify   the chain y_1..y_gamma with the run's acceptance rule: only gamma changes, and gamma
             reads the draft alone, so greedy output is `ar`'s token for token and sampled output
             keeps the target's law

Where the paper scores expected tokens alone (its cost per gamma flat) and reads the previous
step's draft tokens, speclab prices each drafted token and reads the round's own first position, the
signal there before gamma is set. The compression level is recorded (`level`: the run's dtype) but
is not a feature: speclab runs one level per model (bf16 or fp32), and the model is fit on one. Its
weights are a zoo part (`smollm2-speckv`: speckv.json + speckv.safetensors, fit by `speclab train
speckv` on SmolLM2-135M with smollm2-draft, docs/training.md); its two inputs are scalars, so it
loads for any draft (`model=None`: the part fit for this draft, else the SmolLM2 one).

Each round records Decision("speckv", {"confidence", "entropy", "level", "tokens_per_cost": one value
per gamma}, output gamma, at 1) and the DraftLength record (records.py): the gamma chosen and the
two features.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from speclab.decoding.drafters.model import DraftModelDrafter, host_read
from speclab.decoding.speculative import Context
from speclab.decoding.tree import DraftTree
from speclab.models.parts import paired_part, read_part, resolve_part, save_part
from speclab.records import DraftLength
from speclab.trace import Decision

CONFIG, WEIGHTS, KEY = "speckv.json", "speckv.safetensors", "speclab_speckv"
DEFAULT_PART = "smollm2-speckv"


class LengthModel(nn.Module):
    """(confidence, entropy) -> P(the first j draft tokens all accepted), j = 1..G."""

    def __init__(self, G: int = 8, hidden: int = 16):
        super().__init__()
        self.G = G
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.Tanh(), nn.Linear(hidden, G))
        self.register_buffer("mean", torch.zeros(2))
        self.register_buffer("std", torch.ones(2))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.net((x - self.mean) / self.std)                     # (B, G)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 2) features -> (B, G) P(first j accepted), non-increasing in j."""
        return torch.cummin(torch.sigmoid(self.logits(x)), dim=-1).values


def tokens_per_cost(P: list[float], cost: float) -> list[float]:
    """Per gamma = 1..len(P): expected tokens of the round (1 + sum of P_j, j <= gamma) over its cost
    in ar steps (1 + gamma * cost)."""
    out, tokens = [], 1.0
    for g, p in enumerate(P, start=1):
        tokens += p
        out.append(tokens / (1.0 + g * cost))
    return out


def save_model(model: LengthModel, out: str | Path, meta: dict) -> Path:
    return save_part(model, out, CONFIG, WEIGHTS, KEY, {"G": model.G, "hidden": model.net[0].out_features, **meta})


def model_info(where: str | Path) -> dict:
    return read_part(where, CONFIG, KEY, f"{where} holds no SpecKV length model ({CONFIG}): fit one with "
                                         "`speclab train speckv` (docs/training.md)")


def load_model(where: str | Path) -> tuple[LengthModel, dict]:
    from safetensors.torch import load_file
    info = model_info(where)
    model = LengthModel(info["G"], info["hidden"])
    model.load_state_dict(load_file(str(Path(where) / WEIGHTS)))
    return model.eval(), info


def resolve_model(given: str | None, draft) -> Path:
    """The length model's directory: `given` (a zoo name or a directory), the zoo's part fit for this
    draft, or the SmolLM2 part (its inputs are scalars: it reads any draft)."""
    from speclab.models.zoo import zoo_path
    name = getattr(draft, "name_or_path", None)
    paired = lambda: paired_part(CONFIG, KEY, "draft", name) or zoo_path(DEFAULT_PART, CONFIG)  # noqa: E731
    return resolve_part(given, paired, "speckv", "model", "SpecKV length model", "speckv", "None for the zoo's")


class SpecKVDrafter(DraftModelDrafter):
    name = "speckv"

    def __init__(self, draft, model: str | None = None, max_k: int | None = None, cost: float | None = None,
                 backend: str = "auto"):
        where = resolve_model(model, draft)
        self.policy, info = load_model(where)
        G = self.policy.G
        if max_k is None:
            max_k = G
        if isinstance(max_k, bool) or not isinstance(max_k, int) or not 1 <= max_k <= G:
            raise ValueError(f"speckv: max_k must be an integer in 1..{G} (the lengths the model in {where} "
                             f"predicts for), got {max_k!r}")
        if cost is None:
            cost = info["cost"]
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
            raise ValueError(f"speckv: cost must be a number >= 0 (one more draft token's price in ar steps), "
                             f"got {cost!r}")
        super().__init__(draft, backend, k=max_k, max_k=max_k)
        self.cost = float(cost)
        self.level = str(next(draft.parameters()).dtype).removeprefix("torch.")

    def reads_each_step(self) -> bool:
        return True

    def choose(self, logits: torch.Tensor) -> tuple[int, float, float, list[float]]:
        """gamma from the draft's first logits (V,) of the round; with its features and scores."""
        q = logits.float().softmax(-1)
        c, H = host_read(q.max(), -(q * q.clamp_min(1e-30).log()).sum())
        with torch.no_grad():
            P = self.policy(torch.tensor([[c, H]], dtype=torch.float32))[0, :self.max_k].tolist()
        scores = tokens_per_cost(P, self.cost)
        return 1 + max(range(len(scores)), key=scores.__getitem__), c, H, scores

    def lm_step(self, lm, subset: bool = False):
        """draft-model's step (over the trimmed head's ids where it has one: the same softmax, as the
        V-wide spread is -inf elsewhere), keeping the round's first logits for choose()."""
        step = DraftModelDrafter.lm_step(lm, subset)

        def watched(inp):
            logits = step(inp)
            if self.first is None:
                self.first = logits
            return logits
        return watched

    def propose(self, ctx: Context) -> DraftTree:
        self.first = None
        tree = super().propose(ctx)
        tree.info.update(DraftLength(chosen_k=self.gamma, confidence=round(self.c, 6), entropy=round(self.H, 6)).info())
        if self.record is not None:
            tree.decisions.append(Decision(self.name, {"confidence": round(self.c, 6), "entropy": round(self.H, 6),
                                                       "level": self.level,
                                                       "tokens_per_cost": [round(s, 4) for s in self.scores]},
                                           output=self.gamma, at=1))
        return tree

    def stop_after(self, i: int, token: int, q_tok: float) -> bool:
        if i == 0:
            self.gamma, self.c, self.H, self.scores = self.choose(self.first)
        return i + 1 >= self.gamma
