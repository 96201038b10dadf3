"""Judge decoding's probe (Bachmann et al., ICLR 2025): from the target's own last-layer state at a
drafted token, computed by the verify that scores it, the probability that the token is acceptable
even where it is not the target's choice.

    f     = [x / rms(x), log p(x)]      x (C,): the target's state after its last layer at the draft
                                        token's own position (pre-norm: what `capture_layers` gives),
                                        scaled to unit RMS as the final norm scales it; p(x): the
                                        target's probability of the token (softmax of its logits
                                        after the parent, T = 1), from the same verify
    score = sigmoid(w . (f - mu) / sd + b)

One weight per hidden unit, as the paper's "16k-parameter linear head" for a 16k-wide target, plus
one for log p(x): speclab's addition, so the probe starts from what a rule reading only the verify's
logits knows (the paper's head reads the embedding alone). mu and sd standardise each feature over
the training rows (the last layer's residual stream has a few units far larger than the rest). A probe is a directory: `judge.json` (`speclab_judge`: the target
it reads, C, how its labels were made, the threshold it was tuned for and its held-out evaluation)
and `judge.safetensors` (fp32: w, b, mu, sd), kept as models/parts.py keeps a small part:
`paired_judge` finds the zoo's probe for a target.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from speclab.models.parts import paired_part, read_part, resolve_part, save_part

KEY = "speclab_judge"
CONFIG, WEIGHTS = "judge.json", "judge.safetensors"


class JudgeProbe(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.w = nn.Parameter(torch.zeros(hidden_size + 1))
        self.b = nn.Parameter(torch.zeros(()))
        self.register_buffer("mu", torch.zeros(hidden_size + 1))
        self.register_buffer("sd", torch.ones(hidden_size + 1))

    @staticmethod
    def features(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """(..., C + 1): unit-RMS states from pre-norm states x (..., C), and log p (...,)."""
        x = x.float()
        lp = p.float().clamp_min(1e-30).log()[..., None]
        return torch.cat([x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6), lp], -1)

    def fit_scale(self, x: torch.Tensor, p: torch.Tensor) -> None:
        """mu and sd from training states x (N, C) and probabilities p (N,)."""
        f = self.features(x, p)
        self.mu.copy_(f.mean(0))
        self.sd.copy_(f.std(0).clamp_min(1e-4))

    def forward(self, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Logits (...,) of P(acceptable) from pre-norm states x (..., C) and the target's p(x) (...,)."""
        return ((self.features(x, p) - self.mu) / self.sd) @ self.w + self.b

    @torch.no_grad()
    def score(self, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return self.forward(x.to(self.w.device), p.to(self.w.device)).sigmoid()


def save_judge(probe: JudgeProbe, out: str | Path, meta: dict) -> Path:
    """Write judge.safetensors and judge.json into `out`, each beside its name first."""
    return save_part(probe, out, CONFIG, WEIGHTS, KEY, {"hidden_size": probe.hidden_size, **meta})


def judge_info(where: str | Path) -> dict:
    return read_part(where, CONFIG, KEY, f"{where} holds no judge probe ({CONFIG}): train one with "
                                         "`speclab train judge` (docs/training.md)")


def load_judge(where: str | Path) -> JudgeProbe:
    """The probe in directory `where` (fp32, eval mode)."""
    from safetensors.torch import load_file
    probe = JudgeProbe(judge_info(where)["hidden_size"])
    probe.load_state_dict(load_file(str(Path(where) / WEIGHTS)))
    return probe.eval()


def paired_judge(target_name: str | None) -> Path | None:
    """The zoo's probe trained for the target named `target_name` (its zoo name), or None."""
    return paired_part(CONFIG, KEY, "target", target_name)


def resolve_judge(judge: str | None, model) -> Path:
    """The probe's directory: `judge` (a zoo name or a directory), or the zoo's probe for the target."""
    name = getattr(model, "name_or_path", None)
    return resolve_part(judge, lambda: paired_judge(name), "rule 'judge'", "judge", "judge probe for the target "
                        f"{Path(str(name)).name!r}", "judge --target NAME", "leave it out for the zoo's probe")
