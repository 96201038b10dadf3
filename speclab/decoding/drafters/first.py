"""FiRST: routers read the prompt once and choose the layers its decoding skips (lossy).

FiRST (Jain et al. 2024, "FiRST: Finetuning Router-Selective Transformers for Input-Adaptive Latency
Reduction"): no draft and no verify. Layer-specific routers read the prompt at prefill and decide,
once per request, which decoder layers to skip while decoding that sequence. speclab's reading:

    prefill   the prompt runs through every layer (its KV cache is whole), capturing the residual
              stream at the input of layers 1..L-2 (the first and the last always run)
    route     per layer i, f_i = the mean over the prompt's rows of x / rms(x) at that input;
              router i scores s_i = sigmoid(w_i . (f_i - mu_i) / sigma_i + b_i), the chance that
              skipping layer i costs this prompt's continuation little (Routers: one linear map a layer)
    choose    the `budget` = round(skip_ratio L) layers of highest score among those scoring at
              least `threshold` (0: always the budget; higher: fewer where the routers doubt)
    decode    every later forward runs the target less those whole layers (SkipSet.layers): a skipped
              layer writes no KV for decoded tokens, and nothing reads those slots, since the layer
              stays skipped for the rest of the sequence (its prompt slots stay whole, unread)

The first new token comes from the full prefill. The reference library gives FiRST's abstract only
("compatible with KV caching"), not how the cache is kept whole nor the router's form; the form here
(a linear map on the prompt's mean state) and the labels (`speclab train first`: per prompt, the layers
whose skip moves the target's own continuation least in KL) are speclab's. `adaptive=False` runs the
part's input-independent set instead: the layers its training prompts labelled skippable most often
(the same budget and threshold over those frequencies), the fixed set FiRST has to beat.

The routers are a zoo part (NAME/first.json + first.safetensors, speclab.models.parts): `routers=None`
finds the one trained for the target (`code-first` for code-target), else a zoo name or a directory.
In the trace every round's info holds `skip` (records.SkipMask: "." runs, "x" skipped, all "." for
the prefill), so the skip-mask figure draws it; the first round holds the RouterChoice record (per
layer its score, None for the first and last, the threshold, the layers skipped) and one `first`
decision (scores, budget, mode; output the mask). figures.first draws the scores against the mask.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from speclab.decoding.drafters.swift import n_layers_of
from speclab.decoding.speculative import Context, Drafter, Outcome
from speclab.decoding.tree import DraftTree
from speclab.models.lean.skips import SkipSet
from speclab.models.parts import paired_part, read_part, resolve_part, save_part
from speclab.records import RouterChoice
from speclab.trace import Decision

CONFIG, WEIGHTS, KEY = "first.json", "first.safetensors", "speclab_first"


class Routers(nn.Module):
    """One linear router per layer 1..L-2: features (B, L-2, C) -> skip scores (B, L-2)."""

    def __init__(self, n_layers: int, hidden: int):
        super().__init__()
        R = n_layers - 2
        self.n_layers, self.hidden = n_layers, hidden
        self.w = nn.Parameter(torch.zeros(R, hidden))
        self.b = nn.Parameter(torch.zeros(R))
        self.register_buffer("mu", torch.zeros(R, hidden))
        self.register_buffer("sigma", torch.ones(R, hidden))

    def logits(self, f: torch.Tensor) -> torch.Tensor:
        return ((f - self.mu) / self.sigma * self.w).sum(-1) + self.b          # (B, R)

    def forward(self, f: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.logits(f))


def prompt_features(captured: dict, n_layers: int) -> torch.Tensor:
    """(L-2, C) fp32: per layer i = 1..L-2 the mean over the prompt's rows of x / rms(x), x the
    residual stream at layer i's input (captured[i]: the state after i layers, (1, T, C))."""
    x = torch.cat([captured[i] for i in range(1, n_layers - 1)]).float()     # (L-2, T, C): few ops, on a
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)).mean(1)  # busy CPU each one costs


def choose(scores: list, budget: int, threshold: float) -> list[int]:
    """The layers to skip: the `budget` highest scores (None: never) at or above `threshold`, ties to
    the lower layer; in layer order."""
    ranked = sorted((i for i, s in enumerate(scores) if s is not None and s >= threshold),
                    key=lambda i: (-scores[i], i))
    return sorted(ranked[:budget])


def save_routers(model: Routers, out: str | Path, meta: dict) -> Path:
    return save_part(model, out, CONFIG, WEIGHTS, KEY, {"n_layers": model.n_layers, "hidden": model.hidden, **meta})


def load_routers(where: str | Path) -> tuple[Routers, dict]:
    from safetensors.torch import load_file
    info = read_part(where, CONFIG, KEY, f"{where} holds no FiRST routers ({CONFIG}): train them with "
                                         "`speclab train first --target ... --out DIR` (docs/training.md)")
    model = Routers(info["n_layers"], info["hidden"])
    model.load_state_dict(load_file(str(Path(where) / WEIGHTS)))
    return model.eval(), info


def resolve_routers(given, target_model) -> Path:
    name = getattr(target_model, "name_or_path", None)
    return resolve_part(given, lambda: paired_part(CONFIG, KEY, "target", name), "first", "routers",
                        f"FiRST routers for the target {name!r}", "first --target TARGET", "None for the zoo's")


class FirstDrafter(Drafter):
    """Drafts nothing: the first round's forward is the full prefill, whose captured states the
    routers read; every later round is one token of the target less the chosen layers."""
    name = "first"

    def __init__(self, target_model, routers: str | None = None, skip_ratio: float = 0.25, threshold: float = 0.0,
                 adaptive: bool = True):
        super().__init__()
        n = n_layers_of(target_model)
        if n < 3:
            raise ValueError(f"first skips layers between the first and the last of a Llama-style decoder "
                             f"(model.model.layers); this model has {n} layers")
        if isinstance(skip_ratio, bool) or not isinstance(skip_ratio, (int, float)) or not 0 <= skip_ratio <= 1:
            raise ValueError(f"skip_ratio must be in [0, 1] (the share of the layers a request may skip), "
                             f"got {skip_ratio!r}")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
            raise ValueError(f"threshold must be in [0, 1] (the score a layer needs to be skipped; 0: the budget "
                             f"always), got {threshold!r}")
        if not isinstance(adaptive, bool):
            raise ValueError(f"adaptive must be true (the routers) or false (the part's fixed set), got {adaptive!r}")
        where = resolve_routers(routers, target_model)
        self.routers, info = load_routers(where)
        hidden = target_model.config.hidden_size
        if (info["n_layers"], info["hidden"]) != (n, hidden):
            raise ValueError(f"the routers in {where} were trained for {info['n_layers']} layers of width "
                             f"{info['hidden']}, this target has {n} of {hidden}: train routers for it")
        self.n_layers, self.threshold, self.adaptive = n, float(threshold), adaptive
        self.budget = min(round(skip_ratio * n), n - 2)
        self.freq = [None] + list(info["label_freq"]) + [None]           # per layer, for adaptive=False

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.saved_capture = target.capture_layers
        target.skip = None          # transformers' forward refuses a skip set (models.hf.SKIP_REFUSED)
        if self.adaptive:
            target.capture_layers = tuple(range(1, self.n_layers - 1))
        self.round, self.mask = 0, "." * self.n_layers

    def end(self):
        self.target.skip = None
        self.target.capture_layers = self.saved_capture

    def propose(self, ctx: Context) -> DraftTree:
        return DraftTree()

    def route(self) -> list:
        """Per layer the score (None: layers 0 and L-1), from the prefill's captured states."""
        if not self.adaptive:
            return self.freq
        f = prompt_features(self.target.captured, self.n_layers)
        with torch.no_grad():
            s = self.routers(f[None])[0].tolist()
        return [None] + [round(v, 4) for v in s] + [None]

    def observe(self, out: Outcome) -> None:
        """Round 0 ran the prompt at full depth: route, then set the skip set for the rest."""
        out.tree.info["skip"] = self.mask
        if self.round == 0:
            scores = self.route()
            skipped = choose(scores, self.budget, self.threshold)
            self.target.capture_layers = self.saved_capture
            self.target.skip = SkipSet.layers(skipped) if skipped else None
            self.mask = "".join("x" if i in skipped else "." for i in range(self.n_layers))
            if self.record is not None:
                mode = "router" if self.adaptive else "fixed"
                out.tree.info.update(RouterChoice(router_scores=scores, router_threshold=self.threshold,
                                                  router_budget=self.budget, router_skipped=skipped,
                                                  router_mode=mode).info())
                out.tree.decisions.append(Decision("first", {"scores": scores, "budget": self.budget, "mode": mode},
                                                   self.threshold, self.mask,
                                                   note="prompt: full depth; the mask holds from the next token"))
        self.round += 1
