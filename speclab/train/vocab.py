"""The trimmed vocabulary of a draft or a head: the ids it scores, most frequent first, shared by
the draft-model trainer (smollm2_draft.py) and the head trainers (heads.py, eagle3.py).
"""
from __future__ import annotations

import torch


def select_head_ids(tokens: torch.Tensor, n: int, always: list[int], vocab_size: int,
                    counts: torch.Tensor | None = None, fill: bool = False) -> torch.Tensor:
    """The `n` most frequent ids of `tokens` (or of precomputed `counts`), most frequent first;
    `always` are kept in any case (they take the places of the least frequent ones).

    fill: top up to `n` with the lowest unseen ids. A BPE vocabulary is numbered in merge order, so
    low ids are the tokens frequent in the tokenizer's own corpus: with ~100 chat rows, a held-out
    answer's words are often unseen ones, and the low ids cover more of them than nothing does.
    """
    if counts is None:
        counts = torch.bincount(tokens.long().flatten(), minlength=vocab_size)
    order = torch.argsort(counts, descending=True, stable=True)
    order = order[counts[order] > 0]
    keep = [i for i in order.tolist() if i not in set(always)][:max(0, n - len(always))]
    ranked = sorted(set(always) | set(keep), key=lambda i: (-float(counts[i]), i))
    if fill and len(ranked) < n:
        have = set(ranked)
        ranked += [i for i in range(vocab_size) if i not in have][:n - len(ranked)]
    return torch.tensor(ranked, dtype=torch.long)


def coverage(tokens: torch.Tensor, head_ids: torch.Tensor) -> float:
    """Share of `tokens` inside the subset."""
    inside = torch.isin(tokens.long(), head_ids)
    return float(inside.float().mean()) if len(tokens) else float("nan")


def subset_index(head_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(V,) position of each token id in the subset, -1 outside it."""
    idx = torch.full((vocab_size,), -1, dtype=torch.long)
    idx[head_ids] = torch.arange(len(head_ids))
    return idx


def text_head_ids(tok, data: dict, rows: list[int], size: int, V: int) -> torch.Tensor:
    """A trimmed head's ids for a head trained on `rows` of head_data's text: the chat specials,
    then the ids the text uses most, `size` in all (at most V)."""
    specials = [i for i in tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])
                if i is not None and i != tok.unk_token_id]
    pos = torch.cat([torch.arange(int(data["offsets"][r]), int(data["offsets"][r + 1])) for r in rows])
    counts = torch.bincount(data["tokens"][pos].long(), minlength=V).float()
    return select_head_ids(None, min(size, V), specials, V, counts=counts, fill=True)

