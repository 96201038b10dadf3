"""Model-free drafters that copy: prompt lookup (n-gram match) and suffix matching.

prompt-lookup   find an earlier occurrence of the last n tokens (n = max_ngram down to
                min_ngram) in prompt + output, the earliest by default (`prefer="recent"` for the
                latest); propose the k tokens that followed it. With `grow` > 0 the draft length
                follows the evidence: min(k, max(1, grow * (n - 1))) for a match of n tokens, so
                a lone 1-gram hit (often chance) costs a 2-token verify, not a (k+1)-token one.
suffix          SuffixDecoding: a suffix automaton over the prompt, the output so far AND earlier
                requests in this process finds the longest suffix of the context seen before; the
                draft length grows with the match length (k = min(max_k, factor * match)).
All drafts are point masses (q = 1): under sampling they are accepted with probability p(x).
"""
from __future__ import annotations

from speclab.decoding.drafters.model import check_k
from speclab.decoding.speculative import Context, Drafter, Outcome
from speclab.decoding.tree import DraftTree


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, k: int = 8, max_ngram: int = 3, min_ngram: int = 1, prefer: str = "first",
                 grow: int = 0):
        super().__init__()
        check_k(k)
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if prefer not in ("first", "recent"):
            raise ValueError(f"prefer must be 'first' (earliest match, as transformers) or 'recent', got {prefer!r}")
        if grow < 0:
            raise ValueError(f"grow must be >= 0 (0 = always k tokens), got {grow}")
        self.k, self.max_ngram, self.min_ngram, self.prefer, self.grow = k, max_ngram, min_ngram, prefer, grow

    def propose(self, ctx: Context) -> DraftTree:
        ids = ctx.ids
        for n in range(min(self.max_ngram, len(ids) - 1), self.min_ngram - 1, -1):
            tail = ids[-n:]
            starts = range(0, len(ids) - n) if self.prefer == "first" else range(len(ids) - n - 1, -1, -1)
            for j in starts:
                if ids[j:j + n] == tail:
                    k = min(self.k, max(1, self.grow * (n - 1))) if self.grow else self.k
                    cont = ids[j + n: j + n + k]
                    return DraftTree.chain(cont, [1.0] * len(cont), f"{n}-gram@{j}", ngram=n, match_at=j)
        return DraftTree(info={"ngram": 0})


class SuffixAutomaton:
    """Online suffix automaton over a token sequence (Blumer et al.): O(1) amortised extend.

    Each state keeps `end`, the end position of its first occurrence, so a match can be continued
    by reading the text after it.
    """

    def __init__(self):
        self.next: list[dict[int, int]] = [{}]
        self.link, self.len, self.end = [-1], [0], [-1]
        self.last = 0
        self.text: list[int] = []

    def extend(self, c: int):
        self.text.append(c)
        cur = len(self.len)
        self.next.append({}); self.len.append(self.len[self.last] + 1)
        self.link.append(-1); self.end.append(len(self.text) - 1)
        p = self.last
        while p != -1 and c not in self.next[p]:
            self.next[p][c] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][c]
            if self.len[p] + 1 == self.len[q]:
                self.link[cur] = q
            else:
                clone = len(self.len)
                self.next.append(dict(self.next[q])); self.len.append(self.len[p] + 1)
                self.link.append(self.link[q]); self.end.append(self.end[q])
                while p != -1 and self.next[p].get(c) == q:
                    self.next[p][c] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur

    def step(self, state: int, length: int, c: int) -> tuple[int, int]:
        """Matching statistics: extend a match (state, length) by token c, falling back on links."""
        while state and c not in self.next[state]:
            state = self.link[state]
            length = self.len[state]
        if c in self.next[state]:
            return self.next[state][c], length + 1
        return 0, 0


SEPARATOR = -1  # between requests in the shared automaton: never matched by a real token


class SuffixDrafter(Drafter):
    """Matches the context against (a) itself and (b) every earlier request in this process."""
    name = "suffix"
    history = SuffixAutomaton()   # shared by all SuffixDrafters of the process: earlier requests

    def __init__(self, max_k: int = 16, factor: float = 1.0, min_match: int = 2):
        super().__init__()
        check_k(max_k, "max_k")
        self.max_k, self.factor, self.min_match = max_k, factor, min_match

    @classmethod
    def forget(cls):
        """Drop the history of earlier requests (a benchmark pass starts from none)."""
        cls.history = SuffixAutomaton()

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        self.own = SuffixAutomaton()
        self.hist_state, self.hist_len, self.fed = 0, 0, 0

    def _feed(self, ids: list[int]):
        for c in ids[self.fed:]:
            self.own.extend(c)
            self.hist_state, self.hist_len = self.history.step(self.hist_state, self.hist_len, c)
        self.fed = len(ids)

    def propose(self, ctx: Context) -> DraftTree:
        self._feed(ctx.ids)
        # (a) own text: the suffix link of the last state is the longest suffix seen earlier
        own_state = self.own.link[self.own.last]
        own_len = self.own.len[own_state] if own_state > 0 else 0
        candidates = []
        if own_len:
            e = self.own.end[own_state]
            candidates.append((own_len, self.own.text, e, "self"))
        if self.hist_len:
            candidates.append((self.hist_len, self.history.text, self.history.end[self.hist_state], "history"))
        if not candidates:
            return DraftTree(info={"match": 0})
        match, text, e, where = max(candidates, key=lambda c: c[0])
        if match < self.min_match:
            return DraftTree(info={"match": match})
        k = max(1, min(self.max_k, int(self.factor * match)))
        cont = []
        for t in text[e + 1: e + 1 + k]:
            if t == SEPARATOR:
                break
            cont.append(t)
        return DraftTree.chain(cont, [1.0] * len(cont), f"suffix:{where}", match=match, k=len(cont))

    def end(self):
        # this request becomes history for the next ones
        h = type(self).history
        for c in self.own.text:
            h.extend(c)
        h.extend(SEPARATOR)
