"""Model-free copy drafters on hand-made contexts: what they propose, and why."""
import pytest
import torch

from speclab.decoding.drafters.lookup import PromptLookupDrafter, SuffixAutomaton, SuffixDrafter
from speclab.decoding.speculative import Context


def ctx(ids):
    return Context(ids=list(ids), n_prompt=len(ids), pending=1, device=torch.device("cpu"))


def test_prompt_lookup_copies_what_followed_the_earliest_match():
    d = PromptLookupDrafter(k=3)
    t = d.propose(ctx([5, 6, 7, 8, 9, 1, 5, 6, 2, 5, 6]))   # tail (5, 6) seen at 0 and 6
    assert t.tokens == [7, 8, 9] and t.info["ngram"] == 2 and t.info["match_at"] == 0
    assert PromptLookupDrafter(k=3, prefer="recent").propose(ctx([5, 6, 7, 8, 9, 1, 5, 6, 2, 5, 6])).tokens == [2, 5, 6]


def test_prompt_lookup_grow_sizes_the_draft_by_the_evidence():
    d = PromptLookupDrafter(k=12, max_ngram=5, grow=4)
    lone = d.propose(ctx([1, 2, 3, 4, 9, 4]))                 # only the 1-gram (4) recurs
    assert lone.info["ngram"] == 1 and lone.tokens == [9]     # max(1, 4 * 0) = 1 token
    long = list(range(10, 30))
    t = d.propose(ctx(long + [99] + long[:5]))               # a 5-gram recurs: min(12, 16) tokens
    assert t.info["ngram"] == 5 and t.tokens == long[5:17]
    assert PromptLookupDrafter(k=12, max_ngram=5).propose(ctx([1, 2, 3, 4, 9, 4])).tokens == [9, 4]  # all it can


def test_prompt_lookup_rejects_bad_settings():
    with pytest.raises(ValueError, match="grow"):
        PromptLookupDrafter(grow=-1)
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDrafter(min_ngram=4, max_ngram=3)


def test_suffix_automaton_finds_the_longest_earlier_suffix():
    a = SuffixAutomaton()
    for c in [1, 2, 3, 4, 1, 2, 3]:
        a.extend(c)
    s = a.link[a.last]                                        # longest suffix seen before: 1 2 3
    assert a.len[s] == 3 and a.text[a.end[s] + 1] == 4


def test_suffix_drafter_continues_a_repeat_and_forgets_history_on_request():
    SuffixDrafter.forget()
    d = SuffixDrafter(max_k=4, min_match=2)
    c = ctx([7, 1, 2, 3, 4, 5, 6, 1, 2, 3])
    d.begin(c, None, None, None)
    assert d.propose(c).tokens == [4, 5, 6]                  # match (1 2 3): k = factor * 3
    d.end()
    e = SuffixDrafter(max_k=4, min_match=2)
    c2 = ctx([40, 41, 2, 3, 4])                               # (2, 3, 4) only in the previous request
    e.begin(c2, None, None, None)
    t = e.propose(c2)
    assert t.tokens == [5, 6, 1] and t.source[0] == "suffix:history"
    SuffixDrafter.forget()
    f = SuffixDrafter(max_k=4, min_match=2)
    f.begin(c2, None, None, None)
    assert f.propose(c2).tokens == []
