"""RAPID's RAG drafter (Chen et al., ICML 2025): the draft reads a retrieved, shortened slice of a
long prompt; the target reads all of it and verifies, so under the exact rule the text is the
target's own (lossless). The paper's second half, a target enriched by the draft's distribution,
is an acceptance rule of its own (rules/rapid.py, lossy).

    query     the prompt's last `query` tokens (the question, or the line the edit is at); the draft
              always reads them and everything written after them
    chunks    the prompt before the query, cut into chunks of `chunk` tokens
    retrieve  each chunk scored by BM25 over token ids against the query; the best retrieve // chunk
              kept, in the prompt's order (speclab's retriever: the paper ranks chunks by a dense
              embedding model, which speclab does not ship)
    draft     draft-model's chain over  kept chunks + query + text since, on the draft's own cache;
              a prompt whose head fits `retrieve` is read whole (then this is draft-model)

The slice is retrieved once per request, as the paper retrieves once per query. The draft's cache
sits `offset` = len(slice) - len(head) positions off the target's, so it keeps
`committed + offset` after each verify. Recorded per round: RetrievedSlice (the spans of the target's
context the draft reads, and each model's context length: their KV caches); on the first round one
Decision "rapid-retrieve" with its inputs (chunks, query length, every chunk's score), its
threshold (the lowest score kept) and its output (the chunks kept, the slice's length).
"""
from __future__ import annotations

import math
from collections import Counter

from speclab.decoding.drafters.model import DraftModelDrafter
from speclab.decoding.speculative import Context
from speclab.decoding.tree import DraftTree
from speclab.records import RetrievedSlice
from speclab.trace import Decision

K1, B = 1.2, 0.75                       # BM25's term-frequency saturation and length normalisation


def bm25(chunks: list[list[int]], query: list[int]) -> list[float]:
    """Each chunk's BM25 score against the query's distinct tokens (idf over the chunks)."""
    n, avg = len(chunks), sum(map(len, chunks)) / max(len(chunks), 1)
    df = Counter(t for c in chunks for t in set(c))
    terms = set(query)
    scores = []
    for c in chunks:
        tf = Counter(c)
        s = 0.0
        for t in terms & tf.keys():
            idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
            s += idf * tf[t] * (K1 + 1) / (tf[t] + K1 * (1 - B + B * len(c) / avg))
        scores.append(s)
    return scores


def retrieve(head: list[int], query: list[int], chunk: int, budget: int) -> tuple[list[list[int]], Decision]:
    """The spans [start, end) of `head` the draft reads, in order, and the decision that chose them:
    all of it where it fits `budget` tokens, else the budget // chunk best chunks by BM25 (ties: the
    later, nearer the query)."""
    if len(head) <= budget:
        return ([[0, len(head)]] if head else []), Decision(
            "rapid-retrieve", {"prompt": len(head) + len(query), "query": len(query)}, None,
            {"kept": "all", "tokens": len(head)}, note="the prompt fits what it retrieves: the draft reads it whole")
    starts = list(range(0, len(head), chunk))
    scores = bm25([head[s:s + chunk] for s in starts], query)
    best = sorted(range(len(starts)), key=lambda i: (scores[i], i), reverse=True)[:max(1, budget // chunk)]
    kept = sorted(best)
    spans = [[starts[i], min(starts[i] + chunk, len(head))] for i in kept]
    return spans, Decision(
        "rapid-retrieve", {"chunks": len(starts), "chunk": chunk, "query": len(query),
                           "scores": [round(s, 3) for s in scores]},
        round(min(scores[i] for i in kept), 3), {"kept": kept, "tokens": sum(e - s for s, e in spans)},
        note=f"{len(kept)} of {len(starts)} chunks by BM25 against the query")


class RapidDrafter(DraftModelDrafter):
    """draft-model's chain, its draft reading a retrieved slice of the prompt (RAPID's RAG drafter)."""
    name = "rapid"

    def __init__(self, draft, backend: str = "auto", chunk: int = 64, retrieve: int = 256, query: int = 64, **kw):
        for name, v in (("chunk", chunk), ("retrieve", retrieve), ("query", query)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"rapid's {name} is a number of tokens >= 1, got {v!r}")
        if retrieve < chunk:
            raise ValueError(f"rapid's retrieve ({retrieve} tokens) holds no chunk of {chunk}: give retrieve >= chunk")
        super().__init__(draft, backend, **kw)
        self.chunk, self.retrieve, self.query = chunk, retrieve, query

    def begin(self, ctx, target, sampler, gen, record="light"):
        super().begin(ctx, target, sampler, gen, record)
        prompt = ctx.ids[:ctx.n_prompt]
        self.cut = max(0, ctx.n_prompt - self.query)            # head | query
        self.spans, self.decision = retrieve(prompt[:self.cut], prompt[self.cut:], self.chunk, self.retrieve)
        self.slice = [t for s, e in self.spans for t in prompt[s:e]]
        self.offset = len(self.slice) - self.cut

    def draft_context(self, ctx: Context) -> list[int]:
        return self.slice + ctx.ids[self.cut:]

    def propose(self, ctx: Context) -> DraftTree:
        first = self.lm.length == 0
        tree = super().propose(ctx)
        full = len(ctx.ids)
        tree.info.update(RetrievedSlice(rag_spans=self.spans + [[self.cut, full]], draft_ctx=full + self.offset,
                                        full_ctx=full).info())
        if first and self.record is not None:
            tree.decisions.append(self.decision)
        return tree
