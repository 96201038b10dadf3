"""SpecDec++'s acceptance-prediction head (Huang et al., COLM 2025): from the draft model's last
hidden state at a draft token, the probability that the target accepts that token.

    f    = rms_norm(x) * w_norm                 x (..., C): the draft's state after its last layer
                                                (pre-norm, what `capture_layers` gives); w_norm the
                                                draft's own final norm, copied in, so f is the
                                                post-norm state transformers' hidden_states[-1] is
    f    = f + SiLU(W f + b), n times           ONE ResBlock applied n times: the paper's
                                                `[ResBlock(H)] * n` repeats one module, so its n
                                                blocks share weights
    a    = softmax(Linear(C, 2)(f))[1]          P(accepted)

A head is a directory: `head.json` (`speclab_acceptance_head`: the draft it reads, C, n, eps, how
its labels were made, its held-out evaluation) and `head.safetensors` (fp32, written beside its name
and renamed into place). No config.json, so the zoo does not list it as a model: a drafter finds
the zoo's head for its draft with `paired_head`.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from speclab.models.parts import paired_part, read_part, save_part

KEY = "speclab_acceptance_head"
CONFIG, WEIGHTS = "head.json", "head.safetensors"


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class AcceptanceHead(nn.Module):
    def __init__(self, hidden_size: int, num_layers: int = 3, eps: float = 1e-5, norm: torch.Tensor | None = None):
        super().__init__()
        self.hidden_size, self.num_layers, self.eps = hidden_size, num_layers, eps
        self.register_buffer("norm", torch.ones(hidden_size) if norm is None else norm.detach().float().clone())
        self.block = ResBlock(hidden_size)          # shared by the n applications (the paper's checkpoints)
        self.out = nn.Linear(hidden_size, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits (..., 2) [rejected, accepted] from pre-norm states x (..., C)."""
        f = F.rms_norm(x.float(), (self.hidden_size,), self.norm, self.eps)
        for _ in range(self.num_layers):
            f = self.block(f)
        return self.out(f)

    @torch.no_grad()
    def p_accept(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x).softmax(-1)[..., 1]


def for_draft(draft, num_layers: int = 3) -> AcceptanceHead:
    """A new head (random weights) for a transformers draft model: its width, eps and final norm."""
    cfg = draft.config
    return AcceptanceHead(cfg.hidden_size, num_layers, getattr(cfg, "rms_norm_eps", 1e-5), draft.model.norm.weight)


def save_head(head: AcceptanceHead, out: str | Path, meta: dict) -> Path:
    """Write head.safetensors and head.json into `out`, each beside its name first."""
    return save_part(head, out, CONFIG, WEIGHTS, KEY,
                     {"hidden_size": head.hidden_size, "num_layers": head.num_layers, "eps": head.eps, **meta})


def head_info(where: str | Path) -> dict:
    return read_part(where, CONFIG, KEY, f"{where} holds no acceptance head ({CONFIG}): train one with "
                                         "`speclab train specdecpp` (docs/training.md)")


def load_head(where: str | Path, device=None) -> AcceptanceHead:
    """The head in directory `where` (fp32, eval mode, on `device`)."""
    from safetensors.torch import load_file
    info = head_info(where)
    head = AcceptanceHead(info["hidden_size"], info["num_layers"], info["eps"])
    head.load_state_dict(load_file(str(Path(where) / WEIGHTS)))
    return head.to(device).eval()


def paired_head(draft_name: str | None) -> Path | None:
    """The zoo's head trained for the draft named `draft_name` (its zoo name), or None."""
    return paired_part(CONFIG, KEY, "draft", draft_name)
