"""Equality you can debug: why does a lossless method's greedy output differ from `ar`?

Greedy speculative decoding picks argmax(p) at every position, exactly as `ar` does, so in exact
arithmetic the outputs are identical. In finite precision they are not always: a verify forward
runs several tokens through the same matrices as one row block, and its logits can round
differently from a one-token forward. Where the target's top two tokens are within that rounding,
the two runs may pick different tokens, and from there the texts differ.

`diagnose` finds the first differing position and recomputes the target's logits there both
ways, one token at a time (as `ar` runs) and in one forward over the whole prefix (as a verify
runs). It reports both tokens, their logit margin in each computation, and how far the two
computations disagree (delta). The verdict is "numerical near-tie" when the margin in either
computation is within that disagreement (or one rounding step of the dtype at that magnitude),
else "mismatch": a real bug, because no rounding explains it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from speclab.models.backends import make_lm


@dataclass
class Divergence:
    position: int                   # index into the new tokens where the outputs first differ
    ref_token: int                  # what `ar` emitted there
    token: int                      # what the method emitted there
    margin_one: float               # logit[ref] - logit[token], target run one token at a time
    margin_batch: float             # the same, with the prefix in one forward (a verify's arithmetic; with
                                    # `other`, the other implementation one token at a time)
    top2_one: float                 # top-1 minus top-2 logit there, one token at a time
    delta: float                    # max |one - batch| over the logits: the rounding seen here
    rounding: float                 # one step of the dtype at the top logit's magnitude
    dtype: str
    verdict: str                    # "numerical near-tie" or "mismatch"

    def explain(self, text_of=lambda t: str(t)) -> str:
        return (f"first difference at new token {self.position}: ar {text_of(self.ref_token)!r} "
                f"vs {text_of(self.token)!r}; logit margin {self.margin_one:.4g} (one token at a time), "
                f"{self.margin_batch:.4g} (batched), top-1/top-2 gap {self.top2_one:.4g}; the two "
                f"computations differ by up to {self.delta:.3g} here ({self.dtype}, one rounding step "
                f"{self.rounding:.3g}): {self.verdict}")

    def to_dict(self) -> dict:
        return asdict(self)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, len of the shorter if one is a prefix, None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def rounding_step(x: float, dtype: torch.dtype) -> float:
    """The spacing of `dtype` numbers at magnitude |x| (one ulp)."""
    eps = torch.finfo(dtype).eps
    return float(eps * 2.0 ** torch.tensor(max(abs(x), 1e-30)).log2().floor().item())


@torch.inference_mode()
def diagnose(model, prompt_ids: list[int], ref_ids: list[int], ids: list[int],
             backend: str = "auto", other: str | None = None) -> Divergence | None:
    """Why `ids` (a method's new tokens) differ from `ref_ids` (ar's), or None if they do not.

    The second computation is a verify-style forward (prefix and the method's next tokens at once)
    on the same backend; `other` (a backend, e.g. "hf" for a peer engine that has arithmetic of its
    own) makes it ar's one-token-at-a-time forwards on that backend instead."""
    j = first_difference(ref_ids, ids)
    if j is None:
        return None
    if j >= len(ref_ids) or j >= len(ids):            # one stopped earlier (EOS / length): no logits to compare
        return Divergence(j, ref_ids[j] if j < len(ref_ids) else -1, ids[j] if j < len(ids) else -1,
                          0.0, 0.0, 0.0, 0.0, 0.0, _dtype_name(model), "length")
    prefix = list(prompt_ids) + list(ref_ids[:j])
    lm = make_lm(model, "target", backend)
    dev = next(model.parameters()).device
    run = lambda toks: lm.forward(torch.tensor(toks, device=dev))          # (T, V)
    lm.reset()
    one = run(prompt_ids)[-1]
    for t in ref_ids[:j]:                               # as ar: one token per forward
        one = run([t])[-1]
    lm.reset()
    if other is None:                                   # as a verify: the prefix and the method's next
        batch = run(prefix + list(ids[j:j + 4]))[len(prefix) - 1]   # tokens in one forward (causal: same row)
    else:                                               # ar's forwards in the other implementation
        lm = make_lm(model, "other", other)
        batch = run(prompt_ids)[-1]
        for t in ref_ids[:j]:
            batch = run([t])[-1]
    lm.reset()
    one, batch = one.float(), batch.float()
    a, b = ref_ids[j], ids[j]
    top2 = one.topk(2).values
    dtype = next(model.parameters()).dtype
    delta = float((one - batch).abs().max())
    step = rounding_step(float(top2[0]), dtype)
    m1, m2 = float(one[a] - one[b]), float(batch[a] - batch[b])
    tie = min(abs(m1), abs(m2)) <= max(delta, step)
    return Divergence(j, a, b, m1, m2, float(top2[0] - top2[1]), delta, step, _dtype_name(model),
                      "numerical near-tie" if tie else "mismatch")


def _dtype_name(model) -> str:
    return str(next(model.parameters()).dtype).removeprefix("torch.")
