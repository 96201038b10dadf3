"""How often a drafter agrees with the target on the answers the target writes to a prompt set
people wrote (a dev set such as `chat-dev`): the compass for training text, and what the trainers
pick their checkpoint by.

Why: the held-out rows of the training text (questions the target wrote itself) overstate what a
drafter does on questions people write: a head's first guess agrees less often after hand-written
questions than after the target's own, with the target as sure of its answers in both (docs/training.md,
the training text); the draft model shows the same gap.

  answers(base, tok, prompts, layers)   `ar` writes each answer (so each answer token IS the target's
                                        greedy token); with `layers`, the target's states over prompt +
                                        answer as for training (head_data.target_features) and its
                                        top-1 probability at each answer token (how sure it was)
  agreement(head, row)                  EAGLE head, (n, 2) per answer position: step-1 top-1 hit, top-3 hit
  draft_agreement(draft, rows)          draft model, teacher-forced top-1 over every answer position
Step 1 is the first level of every eagle tree, so its top-3 bounds the bench's depth-1 acceptance.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from speclab.train.head_data import target_features
from speclab.train.ttt import eagle_forward, eagle_step1


@dataclass
class Answer:
    tokens: torch.Tensor          # (T,) prompt + the target's greedy answer
    xs: list[torch.Tensor]        # [(T, C)] bf16 pre-norm states after each of the head's layers
    first: int                    # index of the first answer token
    sure: torch.Tensor | None = None  # (T - first,) the target's top-1 probability at each answer token


@torch.no_grad()
def answers(base, tok, prompts: str, layers: list[int] = (), limit: int | None = None,
            tokens: int = 128) -> list[Answer]:
    """The target's greedy answers (speclab's `ar`, as the bench writes them) to the first `limit`
    items of a prompt set (all by default), with its hidden states after each of `layers`.
    base: the target (bf16)."""
    import speclab
    from speclab.prompts import encode, load_prompts
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
    out = []
    for i, (r, first) in enumerate(zip(rows, firsts)):
        xs = [X[l][off[i]:off[i + 1]] for l in layers]
        sure = None
        if xs:                                  # the last of `layers` is the target's last layer
            h = base.model.norm(xs[-1][first - 1:-1].to(base.dtype))
            sure = base.lm_head(h).float().softmax(-1).max(-1).values
        out.append(Answer(r, xs, first, sure))
    return out


@torch.no_grad()
def agreement(head, row: Answer) -> torch.Tensor:
    """(n, 2) over answer positions: whether the head's step-1 top-1 / any of its top-3 is the
    target's greedy token (the answer token) there. Entry t of the head reads the state at t and
    token t+1, so it guesses token t+2 (the whole row is context); counted where t+1 is an answer
    token, i.e. for the answer tokens after the first."""
    xs = [x.float()[None] for x in row.xs]
    out = eagle_forward(head, eagle_step1(head, xs), row.tokens[None].long(), 1)[0, 0]    # (T-1, C): entry t
    out = out[row.first - 1:-1]                                                          # entries guessing first+1..T-1
    guess = head.lm_head.head_ids[(head.model.norm(out) @ head.lm_head.weight.float().t()).topk(3, -1).indices]
    hit = guess == row.tokens[row.first + 1:, None]
    return torch.stack([hit[:, 0].float(), hit.any(-1).float()], -1)


def mean_agreement(head, rows: list[Answer]) -> torch.Tensor:
    """(2,): top-1 and top-3 over every answer position of `rows`."""
    was = head.training
    head.eval()
    try:
        return torch.cat([agreement(head, r) for r in rows]).mean(0)
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
