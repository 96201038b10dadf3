"""RAPID's RAG drafter (drafters/rapid.py): the retrieval's choice worked by hand, the draft reading
only the retrieved slice and the text since (its greedy drafts are the draft model's own there, not
over the whole prompt), and each round's records and figure. Its greedy identity with `ar` and its
sampling law are in the registry-wide tests (test_engine, test_archs, test_sampling_power); the
enriched target's rule in test_rules and test_bench_quality."""
import pytest
import torch

import speclab
from speclab.decoding.drafters.rapid import retrieve
from speclab.figures.rapid import slice_figure
from speclab.figures.views import view_of


def test_bm25_keeps_the_chunks_that_share_the_querys_rare_tokens():
    """Chunks of 4: [1 1 1 1] [2 3 4 5] [1 1 1 1] [6 7 8 9]; the query 7 8 1. Chunk 3 holds two
    tokens no other chunk has (idf log(1 + 3.5 / 1.5) each), the 1-chunks four of a common one
    (idf log 2), chunk 1 none: a budget of 8 keeps chunk 3 and, of the tied 1-chunks, the later."""
    head = [1, 1, 1, 1, 2, 3, 4, 5, 1, 1, 1, 1, 6, 7, 8, 9]
    spans, d = retrieve(head, [7, 8, 1], chunk=4, budget=8)
    assert spans == [[8, 12], [12, 16]]
    assert d.output == {"kept": [2, 3], "tokens": 8} and d.inputs["chunks"] == 4
    one = 0.6931 * 4 * 2.2 / (4 + 1.2)                                   # idf log 2, tf 4, |c| = avg
    assert d.inputs["scores"] == pytest.approx([one, 0.0, one, 2 * 1.204 * 2.2 / 2.2], abs=2e-3)
    assert d.threshold == pytest.approx(one, abs=2e-3)
    spans, d = retrieve(head[:8], [7, 8], chunk=4, budget=8)             # fits: read whole
    assert spans == [[0, 8]] and d.output["kept"] == "all"


def test_bad_sizes_are_one_line_errors(target, draft):
    for kw, words in ((dict(chunk=0), "chunk is a number of tokens"), (dict(retrieve=8, chunk=16), "retrieve >= chunk")):
        with pytest.raises(ValueError, match=words):
            speclab.generate(target, "def f():", "rapid", draft=draft, max_new_tokens=2, **kw)


def test_the_draft_reads_the_retrieved_slice_and_the_text_since(target, draft, heldout_prompts):
    """Each round's first draft token and its q are the draft model's over the recorded slice plus the
    query and the text since, not over the whole context, and each round records both models' context
    lengths."""
    r = speclab.generate(target, heldout_prompts[0], "rapid", draft=draft, max_new_tokens=24, record="light", k=3,
                         chunk=16, retrieve=32, query=16)
    t = r.trace
    committed = list(t.prompt_ids)
    spans = t.rounds[0].info["rag_spans"]
    assert sum(e - s for s, e in spans[:-1]) == 32 and spans[-1] == [len(committed) - 16, len(committed)]
    decision = t.rounds[0].decisions[0]
    assert decision.policy == "rapid-retrieve" and decision.output["tokens"] == 32
    apart = 0.0
    for rd in t.rounds:
        cut = rd.info["rag_spans"][-1][0]
        ctx = [tok for s, e in rd.info["rag_spans"][:-1] for tok in committed[s:e]] + committed[cut:]
        assert rd.info["draft_ctx"] == len(ctx) and rd.info["full_ctx"] == len(committed)
        with torch.no_grad():
            q = draft[0](torch.tensor([ctx])).logits[0, -1].float().softmax(-1)
            whole = draft[0](torch.tensor([committed])).logits[0, -1].float().softmax(-1)
        x = rd.nodes[0].token
        assert x == int(q.argmax()) and rd.nodes[0].q == pytest.approx(float(q[x]), abs=1e-4)
        apart = max(apart, abs(float(whole[x]) - float(q[x])))
        committed += rd.path_tokens + [rd.emitted]
    assert committed[len(t.prompt_ids):][:len(r.ids)] == r.ids           # the last round cut at max_new_tokens
    assert apart > 1e-3, "the whole context gives the same q: the test cannot tell the slice from it"


def test_the_slice_figure_draws_each_rounds_context_and_slice(target, draft, heldout_prompts):
    r = speclab.generate(target, heldout_prompts[0], "rapid", draft=draft, max_new_tokens=16, record=None, k=3,
                         chunk=16, retrieve=32, query=16)
    t = r.trace
    assert "retrieved slice" in view_of(t).names
    fig = slice_figure(t, 1)
    full, chunks, tail, now = fig.data
    assert list(full.y) == [rd.info["full_ctx"] for rd in t.rounds]
    assert len([y for y in chunks.y if y is not None]) == 2 * 2 * len(t.rounds)        # 2 chunks a round, 2 ends
    assert list(tail.y[:2]) == t.rounds[0].info["rag_spans"][-1] and list(now.x) == [2, 2]
    plain = speclab.generate(target, heldout_prompts[0], "draft-model", draft=draft, max_new_tokens=4, record=None)
    assert "retrieved slice" not in view_of(plain.trace).names
