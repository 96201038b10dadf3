"""The masked-diffusion step loop (reference note A.13): one engine, many commit policies.

State: the canvas x = prompt + G generation slots, initially all <|mask|>, cut into blocks of
`block_length` decoded left to right (semi-autoregressive; block_length = G is one block). Each
step is ONE forward over the whole canvas; per generation position it gives the proposed token
x0 (argmax, or Gumbel-max at temperature T), its probability, and the top-1/top-2 margins; the
policy picks which masked positions of the active block to commit (a cross-block choice, ETE's: of
any block the model saw; a later block it filled is skipped). A policy that revises may also
rewrite committed positions of the active block with the step's proposal, or take them back
(re-mask them), and ask for more forwards over a block it has filled (LLaDA 2.1's post-edit steps):
each such change is a trace Edit, applied before the step's commits when replayed. Earlier blocks
stay as written (a block-causal model has cached them). A block ends when it holds no mask and the
policy asks for no more. On a block-causal model a policy may choose each step's forward itself
(`block_forward`: dllm-fastv2 runs a sub-block on a cache of its block). Stop: every slot
committed, or (eos_stop) an <|endoftext|> is committed with every slot before it committed: the
answer is written, whatever the slots after it would hold.

Positions in the trace are generation coordinates (0 .. G-1); the output is the canvas up to and
including the first <|endoftext|>.
"""
from __future__ import annotations

import time

import torch

from speclab.decoding.dllm_policies import Choice, View
from speclab.trace import MASK as EDIT_MASK
from speclab.trace import DenoiseStep, Edit, Totals

# a policy may look at a block again after filling it, but never forever: LLaDA 2.1's own bound is
# B + its post-edit steps + 1 forwards a block
MAX_LOOKS_PER_SLOT, MAX_EXTRA_LOOKS = 4, 64


def check_shape(gen_length: int, block_length: int | None) -> int:
    if type(gen_length) is not int or gen_length < 1:            # not a bool: True is an int to Python
        raise ValueError(f"gen_length must be an integer >= 1, got {gen_length!r}")
    block_length = block_length or gen_length
    if type(block_length) is not int or block_length < 1 or gen_length % block_length:
        raise ValueError(f"block_length={block_length!r} must divide gen_length={gen_length} "
                         "(e.g. gen_length 64 with block_length 64, 32, 16 or 8)")
    return block_length


def never_propose_mask(logits: torch.Tensor, mask_id: int) -> torch.Tensor:
    """<|mask|> is not a token to write: committing it would leave the slot masked forever
    (a loop a weak model or a sampled draw can hit). Its probability goes to zero."""
    return logits.index_fill(-1, torch.tensor([mask_id], device=logits.device), -float("inf"))


def propose(logits: torch.Tensor, temperature: float, gen: torch.Generator):
    """logits (G, V) -> x0, conf = p(x0), prob margin p1-p2, logit margin l1-l2, entropy; all (G,)."""
    p = logits.softmax(-1)
    top = logits.topk(2, dim=-1)
    if temperature > 0:                          # Gumbel-max in float64 (low precision hurts, A.0)
        u = torch.rand(logits.shape, generator=gen, dtype=torch.float64, device=logits.device)
        x0 = (logits.double() / temperature - torch.log(-torch.log(u.clamp_min(1e-300)))).argmax(-1)
    else:
        x0 = top.indices[:, 0]
    conf = p.gather(-1, x0[:, None])[:, 0]
    p2 = p.gather(-1, top.indices)
    entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
    return x0, conf, p2[:, 0] - p2[:, 1], top.values[:, 0] - top.values[:, 1], entropy


def unseen(where: torch.Tensor, mask_id: int, x0, *stats):
    """A block-causal model has not looked at later blocks yet: no proposal there (the mask) and
    zero confidence, margins and entropy, so the views show them as not yet considered."""
    x0[where] = mask_id
    for t in stats:
        t[where] = 0


def block_proposals(den, x: torch.Tensor, lo: int, hi: int, G: int, temperature: float, gen: torch.Generator,
                    forward=None):
    """propose() for a block-causal model: only the active block [lo, hi) is computed (its rows
    from den.block_logits); every other slot is "unseen" (the mask, zero statistics), as a
    block-causal model has not looked at later blocks and earlier ones are committed.
    forward: a policy's own choice of forward, forward(den, x, lo) -> (hi - lo, V) rows in ONE
    network call (dllm-fastv2 runs a sub-block on a cache of the block, or no cache at all)."""
    rows = forward(den, x, lo) if forward is not None else den.block_logits(x, lo)
    rows = never_propose_mask(rows, den.mask_id)                        # (hi - lo, V)
    block = propose(rows, temperature, gen)
    out = [torch.full((G,), den.mask_id, dtype=block[0].dtype, device=rows.device)]
    out += [torch.zeros(G, dtype=t.dtype, device=rows.device) for t in block[1:]]
    for full, part in zip(out, block):
        full[lo:hi] = part
    return tuple(out)


def denoise(den, prompt_ids: list[int], policy, gen_length: int, block_length: int | None = None,
            temperature: float = 0.0, seed: int = 0, record: str | None = "light",
            eos_id: int | None = None, eos_stop: bool = True, progress=None):
    """Run one decode. den: models.dllm.Denoiser. Returns (output ids, DenoiseSteps, Totals)."""
    block_length = check_shape(gen_length, block_length)
    n_blocks = gen_length // block_length
    total_steps = policy.plan(gen_length, n_blocks)
    dev = next(den.model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    P, G, MASK = len(prompt_ids), gen_length, den.mask_id
    x = torch.tensor(list(prompt_ids) + [MASK] * G, device=dev)
    den.start(P, block_length)
    steps: list[DenoiseStep] = []
    t0, f0, step, prev_x0, done = time.perf_counter(), den.forwards, 0, None, False
    for b in range(n_blocks):
        lo, hi = b * block_length, (b + 1) * block_length
        policy.start_block(int((x[P + lo:P + hi] == MASK).sum()))
        i, more = 0, False
        while not done and (more or bool((x[P + lo:P + hi] == MASK).any())):
            if i >= MAX_LOOKS_PER_SLOT * block_length + MAX_EXTRA_LOOKS:
                raise RuntimeError(f"{type(policy).__name__} did not finish block [{lo}, {hi}) in {i} steps: "
                                   "a policy that edits must stop asking for more")
            if den.block_causal:        # one forward over the active block; the other slots unseen
                x0, conf, margin, lmargin, entropy = block_proposals(den, x, lo, hi, G, temperature, gen,
                                                                     policy.block_forward)
            else:
                logits = never_propose_mask(den.logits(x)[P:], MASK)       # (G, V): one forward
                x0, conf, margin, lmargin, entropy = propose(logits, temperature, gen)
            masked = x[P:] == MASK
            eligible = masked.clone()
            eligible[:lo] = eligible[hi:] = False
            rand = torch.rand(G, generator=gen, device=dev)
            # a block-causal model sees no later block: its "every mask" is the active block's
            seen = eligible if den.block_causal else masked
            editable = ~masked
            editable[:lo] = editable[hi:] = False
            ch: Choice = policy.select(View(step, total_steps, (lo, hi), i, eligible, seen, x0, conf,
                                            lmargin, rand, prev_x0, entropy, x[P:], editable))
            commit = ch.commit & (seen if ch.finish or ch.cross_block else eligible)
            if eligible.any() and not commit.any():                     # a step with masks commits something
                commit[torch.where(eligible, conf, torch.full_like(conf, -1.0)).argmax()] = True
            edits = apply_edits(x[P:], ch, editable, x0, MASK)
            x[P:][commit] = x0[commit]
            if record:
                steps.append(record_step(record, (lo, hi), masked, x0, conf, margin, entropy, commit, ch, x[P:],
                                         edits=edits))
            prev_x0, step, i, more = x0, step + 1, i + 1, ch.more
            if progress:
                progress(int((x[P:] != MASK).sum()), G)
            done = (ch.finish and not den.block_causal) or (eos_stop and eos_id is not None and answer_ended(x[P:], MASK, eos_id))
        if done:
            break
    out = _output(x[P:].tolist(), MASK, eos_id)
    totals = Totals(wall_s=time.perf_counter() - t0, target_forwards=den.forwards - f0, new_tokens=len(out),
                    verify_s=time.perf_counter() - t0)
    return out, steps, totals


def apply_edits(gen_x: torch.Tensor, ch: Choice, editable: torch.Tensor, x0: torch.Tensor, mask_id: int) -> list[Edit]:
    """Carry out a choice's edits on the generation canvas gen_x (in place): its re-masks, then its
    rewrites to x0, each only at an editable position (committed, in the active block) and a
    rewrite only where x0 differs from the token held. Returns them as trace Edits, by position."""
    if ch.remask is None and ch.rewrite is None:                        # an unmask-only policy
        return []
    take = ch.remask & editable if ch.remask is not None else torch.zeros_like(editable)
    put = ch.rewrite & editable & ~take & (x0 != gen_x) if ch.rewrite is not None else torch.zeros_like(editable)
    at = lambda m: m.nonzero().flatten().tolist()
    edits = [Edit(p, int(gen_x[p]), EDIT_MASK, ch.reasons.get(p, "taken back")) for p in at(take)]
    edits += [Edit(p, int(gen_x[p]), int(x0[p]), ch.reasons.get(p, "rewritten")) for p in at(put)]
    gen_x[take] = mask_id
    gen_x[put] = x0[put]
    return sorted(edits, key=lambda e: e.pos)


def answer_ended(gen_x: torch.Tensor, mask_id: int, eos_id: int) -> bool:
    """An <|endoftext|> is committed and every slot before it is too: the answer is written, and
    nothing still masked can change it (Fast-dLLM v2 stops here; the slots after it would only be
    filled with more end of text)."""
    ends = (gen_x == eos_id).nonzero()
    return bool(len(ends)) and not bool((gen_x[: int(ends[0])] == mask_id).any())


def _output(tokens: list[int], mask_id: int, eos_id: int | None) -> list[int]:
    if eos_id is not None and eos_id in tokens:
        tokens = tokens[: tokens.index(eos_id) + 1]
    if mask_id in tokens:
        raise RuntimeError("diffusion decode ended with masked positions before the end of text")
    return tokens


def record_step(level, block, masked, x0, conf, margin, entropy, commit, ch: Choice, gen_x,
                own_tokens: bool = False, edits: list[Edit] = ()) -> DenoiseStep:
    """One DenoiseStep; per-position lists follow the order of `masked` (positions masked before).
    own_tokens: the committed tokens are not all the step's top-1 proposals (FreeDave's draft tree
    verifies others), so they are recorded from the canvas after the step. edits: what the step
    rewrote or took back (apply_edits)."""
    pos = masked.nonzero().flatten()
    info = dict(ch.info)
    if ch.finish:
        info["finish"] = True
    if level == "full":
        info["entropy"] = [round(float(e), 4) for e in entropy[pos]]
    return DenoiseStep(block=block, masked=pos.tolist(), top1=x0[pos].tolist(),
                       conf=[round(float(c), 5) for c in conf[pos]], margin=[round(float(m), 5) for m in margin[pos]],
                       committed=commit.nonzero().flatten().tolist(),
                       committed_tokens=gen_x[commit].tolist() if own_tokens else [], threshold=ch.threshold,
                       threshold_scale=ch.scale, tokens=gen_x.tolist(), info=info, edits=list(edits),
                       remasked=[e.pos for e in edits if e.after == EDIT_MASK], decisions=list(ch.decisions))
