"""How often a drafter agrees with the target on the answers the target writes to a prompt set
people wrote (a dev set such as `chat-dev`): the compass for training text, and what the trainers
pick their checkpoint by.

Why: the held-out rows of the training text (questions the target wrote itself) overstate what a
drafter does on questions people write. On the EAGLE head shipped 2026-11-26, step-1 top-1 was 0.54
on held-out Magpie answers against 0.44-0.46 after hand-written questions, with the target as sure
of its answers in both (BENCHMARKS.md, twentieth stop); the draft model shows the same gap.

  answers(base, tok, prompts, layers)   `ar` writes each answer (so each answer token IS the target's
                                        greedy token); with `layers`, the target's states over prompt +
                                        answer as for training (head_data.target_features)
  agreement(head, base, row)            EAGLE head, (n, 3) per answer position: step-1 top-1 hit,
                                        top-3 hit, and the target's own top-1 probability
  draft_agreement(draft, rows)          draft model, teacher-forced top-1 over every answer position
Step 1 is the first level of every eagle tree, so its top-3 bounds the bench's depth-1 acceptance.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from speclab.train.head_data import target_features
from speclab.train.heads import eagle_forward, eagle_step1


@dataclass
class Answer:
    tokens: torch.Tensor          # (T,) prompt + the target's greedy answer
    xs: list[torch.Tensor]        # [(T, C)] bf16 pre-norm states after each of the head's layers
    first: int                    # index of the first answer token


@torch.no_grad()
def answers(base, tok, prompts: str, layers: list[int] = (), limit: int = 20, tokens: int = 128) -> list[Answer]:
    """The target's greedy answers (speclab's `ar`, as the bench writes them) to the first `limit`
    items of a prompt set, with its hidden states after each of `layers`. base: the target (bf16)."""
    import speclab
    from speclab.bench.prompts import encode, load_prompts
    rows, firsts = [], []
    for item in load_prompts(prompts, limit):
        ids = encode(tok, item, tokens, None)
        out = speclab.generate((base, tok), ids, "ar", max_new_tokens=tokens, record=None).ids
        rows.append(torch.tensor(ids + list(out)))
        firsts.append(len(ids))
    lens = torch.tensor([0] + [len(r) for r in rows])
    data = {"tokens": torch.cat(rows).int(), "offsets": lens.cumsum(0)}
    X = {}
    if layers:
        with tempfile.TemporaryDirectory() as d:
            X = target_features(base, data, {l: Path(d) / f"l{l}.safetensors" for l in layers}, log=lambda *a: None)
    off = data["offsets"].tolist()
    return [Answer(r, [X[l][off[i]:off[i + 1]] for l in layers], f) for i, (r, f) in enumerate(zip(rows, firsts))]


@torch.no_grad()
def agreement(head, base, row: Answer) -> torch.Tensor:
    """(n, 3) over answer positions: whether the head's step-1 top-1 / any of its top-3 is the
    target's greedy token there, and the target's top-1 probability. Entry t of the head reads the
    state at t and token t+1, so it guesses the token after t+1 (the whole row is context)."""
    xs = [x.float()[None] for x in row.xs]
    tokens = row.tokens
    out = eagle_forward(head, eagle_step1(head, xs), tokens[None].long(), 1)[0, 0]    # (T-1, C): entry t
    guess = head.lm_head.head_ids[(head.model.norm(out) @ head.lm_head.weight.float().t()).topk(3, -1).indices]
    f = F.rms_norm(xs[-1][0], xs[-1].shape[-1:], base.model.norm.weight.float(), base.config.rms_norm_eps)
    p = (f @ base.lm_head.weight.float().t()).softmax(-1)[1:]           # entry t: the target's p after t+1
    greedy, sure = p.argmax(-1), p.max(-1).values
    rows = slice(max(row.first - 1, 0), len(tokens) - 2)               # token t+1 lies in the answer
    hit = guess[rows] == greedy[rows, None]
    return torch.stack([hit[:, 0].float(), hit.any(-1).float(), sure[rows].float()], -1)


def mean_agreement(head, base, rows: list[Answer]) -> torch.Tensor:
    """(3,): top-1, top-3 and the target's top-1 probability over every answer position of `rows`."""
    was = head.training
    head.eval()
    try:
        return torch.cat([agreement(head, base, r) for r in rows]).mean(0)
    finally:
        head.train(was)


@torch.no_grad()
def draft_agreement(draft, rows: list[Answer]) -> float:
    """Teacher-forced top-1 agreement of a draft model (trimmed head, speclab.models.adapter) with
    the target's greedy answer tokens: the draft reads prompt + answer up to t and guesses t+1."""
    was = draft.training
    draft.eval()
    hit = tot = 0
    try:
        for r in rows:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = draft.model(input_ids=r.tokens[None, :-1].long()).last_hidden_state[0]
                guess = draft.lm_head.head_ids[(h @ draft.lm_head.weight.t()).argmax(-1)]    # (T-1,)
            hit += int((guess[r.first - 1:] == r.tokens[r.first:]).sum())
            tot += len(r.tokens) - r.first
    finally:
        draft.train(was)
    return hit / max(tot, 1)
