"""Model-free copy drafters on hand-made contexts (what they propose, and why), and the suffix
method's history: only in an object the caller owns and passes in."""
import json

import pytest
import torch

from speclab.decoding.drafters.lookup import PromptLookupDrafter, SuffixAutomaton, SuffixDrafter, SuffixHistory
from speclab.decoding.speculative import Context, Outcome
from speclab.decoding.tree import DraftTree


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


def test_prompt_lookup_drafts_longer_right_after_a_draft_accepted_whole():
    d = PromptLookupDrafter(k=2)                              # k_full = 2k + 1 = 5
    long = list(range(10, 30))
    c = ctx(long + [99] + long[:3])                           # a 3-gram recurs: copy what followed it
    d.begin(c, None, None, None)
    verdict = lambda tree, path: Outcome(tree, path, emitted=len(path) + 1, prefix_len=len(c.ids), logits=None,
                                         inputs=c.ids[-1:] + tree.tokens, n_pending=1)
    first = d.propose(c)
    assert first.tokens == long[3:5]
    d.observe(verdict(first, [0, 1]))                         # accepted whole: a copy in progress
    d.observe(verdict(DraftTree(), []))                       # an ar round (no draft) says nothing
    streak = d.propose(c)
    assert streak.tokens == long[3:8]
    d.observe(verdict(streak, [0, 1, 2]))                     # cut short: back to k
    assert d.propose(c).tokens == long[3:5]
    assert PromptLookupDrafter(k=2, k_full=2).k_full == 2     # k_full = k: a fixed length


AVX2 = [1, 1.06, 1.15, 1.25, 1.45, 1.63, 1.94, 2.07, 2.3, 2.5]   # c(T): a Zen 5's avx2 path, SmolLM2
FREE = [1] * 10                                                   # extra rows hide behind the stream


def test_prompt_lookup_auto_sizes_each_draft_to_the_verify_costs_and_the_evidence():
    """k="auto": where rows are free it drafts all it may; where they are dear (AVX2) a state whose
    first token keeps failing drafts nothing, while a copy in progress (accepted whole) drafts long."""
    long = list(range(10, 40))
    c = ctx(long + [99] + long[:3])                           # a 3-gram recurs: 27 tokens could follow
    verdict = lambda tree, path: Outcome(tree, path, emitted=len(path) + 1, prefix_len=len(c.ids), logits=None,
                                         inputs=c.ids[-1:] + tree.tokens, n_pending=1)
    free = PromptLookupDrafter(k="auto", costs=FREE, target_model=object())
    free.begin(c, None, None, None)
    t = free.propose(c)
    assert len(t.tokens) == 16 and t.info["fit_nodes"] == 16 and t.info["fit_curve"] == FREE
    dear = PromptLookupDrafter(k="auto", costs=AVX2, target_model=object())
    dear.begin(c, None, None, None)
    first = dear.propose(c)                                   # nothing learned yet: the prior's length
    assert first.tokens == long[3:3 + len(first.tokens)] and 1 <= len(first.tokens) < 16
    lone = dear.propose(ctx([1, 2, 3, 4, 9, 4]))              # a 1-gram hit (mostly chance): shorter
    assert lone.info["ngram"] == 1 and len(lone.tokens) < len(first.tokens)
    dear.asked = None
    for _ in range(30):                                       # its first token refused, round after round
        dear.observe(verdict(first, []))
        first = dear.propose(c)
    assert first.tokens == [] and first.info["fit_nodes"] == 0 and "fit_curve" not in first.info
    dear.streak = True                                        # a copy in progress: another state
    for _ in range(6):
        copy = dear.propose(c)
        dear.observe(verdict(copy, list(range(len(copy.tokens)))))
    assert len(dear.propose(c).tokens) >= 5                   # accepted whole every time: long again


def test_prompt_lookup_rejects_bad_settings():
    with pytest.raises(ValueError, match="k_full"):
        PromptLookupDrafter(k=5, k_full=3)
    with pytest.raises(ValueError, match="grow"):
        PromptLookupDrafter(grow=-1)
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDrafter(min_ngram=4, max_ngram=3)
    with pytest.raises(ValueError, match="k must be a token count or 'auto'"):
        PromptLookupDrafter(k="long")
    with pytest.raises(ValueError, match="needs target_model"):
        PromptLookupDrafter(k="auto")
    with pytest.raises(ValueError, match="costs is c\\(T\\)"):
        PromptLookupDrafter(k=5, costs=[1, 1.2], target_model=object())


def test_suffix_automaton_finds_the_longest_earlier_suffix():
    a = SuffixAutomaton()
    for c in [1, 2, 3, 4, 1, 2, 3]:
        a.extend(c)
    s = a.link[a.last]                                        # longest suffix seen before: 1 2 3
    assert a.len[s] == 3 and a.text[a.end[s] + 1] == 4


def test_the_automaton_counts_every_substrings_occurrences_as_the_text_grows():
    import random
    rng = random.Random(0)
    text, a = [], SuffixAutomaton()
    for _ in range(400):
        text.append(rng.randint(0, 3))
        a.extend(text[-1])
        if len(text) % 50:
            continue
        for _ in range(40):                                   # random substrings, counted by brute force
            i, n = rng.randrange(len(text) - 6), rng.randint(1, 6)
            pat, st = text[i:i + n], 0
            for c in pat:
                st = a.next[st][c]
            assert a.occ[st] == sum(text[j:j + n] == pat for j in range(len(text) - n + 1)), pat


def test_suffix_tree_drafts_the_frequent_continuations_first_and_prunes_rare_ones():
    # the context ends in (9 1 2), its longest earlier suffix; seen before, it went on with 3 three times,
    # 4 twice and 5 once (1/6 < min_prob 0.2: left out); (9 1 2 3) with 6 twice and 7 once; (9 1 2 4) with 9
    seq = [1, 2, 3, 6, 9, 1, 2, 3, 6, 9, 1, 2, 4, 9, 1, 2, 3, 6, 9, 1, 2, 3, 7, 9, 1, 2, 4, 9, 1, 2, 5, 9, 1, 2]
    c = ctx(seq)
    d = SuffixDrafter(max_k=4, factor=2.0, min_match=2, tree=True, min_prob=0.2)
    d.begin(c, None, None, None)
    t = d.propose(c)
    # best first: 3 (1/2), then 4 (1/3) and 3-6 (1/2 x 2/3) tie, the earlier candidate first, then 4-9 (1/3)
    assert t.tokens == [3, 4, 6, 9] and t.parents == [-1, -1, 0, 1]
    freqs = [d_.inputs["frequency"] for d_ in t.decisions]
    assert freqs == [0.5, 0.3333, 0.6667, 1.0] and all(x.threshold == 0.2 for x in t.decisions)
    assert 5 not in t.tokens and len(t) == 4 == t.info["budget"]   # budget min(max_k, 2 x match 3)
    chain = SuffixDrafter(max_k=4, factor=2.0, min_match=2)
    chain.begin(c, None, None, None)
    assert chain.propose(c).tokens == [3, 6, 9, 1]           # the chain: what followed the first occurrence
    with pytest.raises(ValueError, match="min_prob must be"):
        SuffixDrafter(tree=True, min_prob=1.5)


def test_suffix_drafter_continues_a_repeat_and_keeps_history_only_in_the_owners_object():
    h = SuffixHistory()
    d = SuffixDrafter(max_k=4, min_match=2, history=h, key="v")
    c = ctx([7, 1, 2, 3, 4, 5, 6, 1, 2, 3])
    d.begin(c, None, None, None)
    assert d.propose(c).tokens == [4, 5, 6]                  # match (1 2 3): k = factor * 3
    d.end()
    assert len(h) == 1 and h.tokens == 10
    e = SuffixDrafter(max_k=4, min_match=2, history=h, key="v")
    c2 = ctx([40, 41, 2, 3, 4])                               # (2, 3, 4) only in the previous request
    e.begin(c2, None, None, None)
    t = e.propose(c2)
    assert t.tokens == [5, 6, 1] and t.source[0] == "suffix:history"
    for other in (SuffixDrafter(max_k=4, min_match=2),                          # no history: none at all
                  SuffixDrafter(max_k=4, min_match=2, history=SuffixHistory(), key="v"),   # someone else's
                  SuffixDrafter(max_k=4, min_match=2, history=h, key="another vocabulary")):
        other.begin(c2, None, None, None)
        assert other.propose(c2).tokens == []
    assert not hasattr(SuffixDrafter, "forget") and not hasattr(SuffixDrafter, "history")


def test_suffix_history_is_bounded_and_drops_the_least_recently_used_request():
    h = SuffixHistory(max_tokens=12)
    for doc in ([1, 2, 3, 4], [11, 12, 13, 14], [21, 22, 23, 24]):
        h.add("v", doc)
    d = SuffixDrafter(max_k=2, min_match=2, history=h, key="v")
    c = ctx([9, 1, 2])                                          # drafts from the first (oldest) request
    d.begin(c, None, None, None)
    assert d.propose(c).tokens == [3, 4]                        # ... which makes it the most recently used
    h.add("v", [31, 32, 33, 34])                                # 16 > 12 tokens: down to 3/4 of the bound
    assert h.tokens == 8 and len(h) == 2
    text = h.index("v").auto.text
    assert 1 in text and 31 in text and 11 not in text and 21 not in text   # the least recently used went
    d.end()                                                     # its own 3 tokens join: 11, under the bound
    assert h.tokens == 11 and len(h) == 3
    with pytest.raises(ValueError, match="max_tokens"):
        SuffixHistory(max_tokens=0)
    with pytest.raises(ValueError, match="SuffixHistory"):
        SuffixDrafter(history="shared")


def test_a_running_drafter_follows_the_history_as_it_changes():
    h = SuffixHistory(max_tokens=8)
    d = SuffixDrafter(max_k=2, min_match=2, history=h, key="v")
    c = ctx([5, 6, 7])
    d.begin(c, None, None, None)
    assert d.propose(c).tokens == []
    h.add("v", [5, 6, 7, 8])                                    # another request ends meanwhile: extended in place
    assert d.propose(c).tokens == [8]
    h.add("v", [1, 2, 3, 4, 5, 6])                              # over the bound: rebuilt, a new version
    assert h.tokens <= 6 and 8 not in h.index("v").auto.text
    version = d.hist_version
    c.ids += [1, 2]
    assert d.propose(c).tokens == [3, 4] and d.hist_version != version   # matched afresh on the new automaton


# -- through the API: no history unless the caller passes one --------------------------------------
EARLIER = "def load_settings(path):\n    with open(path) as f:\n        return json.load(f)"
LATER = "def load_settings(path):"       # continues exactly like EARLIER began


def sources(trace) -> set[str]:
    return {n.source for r in trace.rounds for n in r.nodes}


def own_text_only(trace) -> bool:
    """Every drafted token is one of this request's own prompt or output tokens."""
    own = set(trace.prompt_ids) | set(trace.output_ids)
    return all(n.token in own for r in trace.rounds for n in r.nodes) and "suffix:history" not in sources(trace)


def test_two_api_calls_share_nothing_without_a_history(target):
    import speclab
    speclab.generate(target, EARLIER, "suffix", max_new_tokens=8, gate="off")
    b = speclab.generate(target, LATER, "suffix", max_new_tokens=12, gate="off")
    assert own_text_only(b.trace)
    assert b.ids == speclab.generate(target, LATER, "ar", max_new_tokens=12).ids


def test_a_shared_history_carries_text_across_calls(target):
    import speclab
    h = speclab.SuffixHistory()
    # gate off: the cost gate's plain rounds follow the clock, and this pins what the drafter drafts
    speclab.generate(target, EARLIER, "suffix", max_new_tokens=8, history=h, gate="off")
    b = speclab.generate(target, LATER, "suffix", max_new_tokens=12, history=h, gate="off")
    assert "suffix:history" in sources(b.trace)                 # drafts from the earlier request
    assert b.ids == speclab.generate(target, LATER, "ar", max_new_tokens=12).ids   # still lossless
    assert "history" not in b.trace.params                      # the owner's object is not recorded
    assert speclab.Trace.from_dict(json.loads(json.dumps(b.trace.to_dict()))).method == "suffix"
    c = speclab.run(target, LATER, "suffix", max_new_tokens=12, history=speclab.SuffixHistory(), gate="off")
    assert own_text_only(c.trace)                                # a fresh history knows nothing


ORACLE_PROMPT = "def add(a, b):\n    return"


def test_the_oracle_drafts_ars_answer_and_the_target_takes_every_draft(target):
    """With no reference, generate decodes ar's answer first: every draft is then the target's own
    choice, so each round commits k + 1 tokens (the ceiling a perfect draft of length k reaches)."""
    import math
    import speclab
    ref = speclab.generate(target, ORACLE_PROMPT, "ar", max_new_tokens=40, record=None)
    r = speclab.generate(target, ORACLE_PROMPT, "oracle", max_new_tokens=40, k=4)
    t = r.trace.totals
    assert r.ids == ref.ids and t.drafted > 0 and t.accepted == t.drafted
    assert t.target_forwards == math.ceil(len(ref.ids) / 5)
    assert all(n.source.startswith("reference@") for rnd in r.trace.rounds for n in rnd.nodes)
    assert "reference" not in r.trace.params and r.trace.params["k"] == 4   # ar's output is the trace's output


def test_the_oracle_stops_drafting_once_the_text_leaves_its_reference(target):
    import speclab
    ref = speclab.generate(target, ORACLE_PROMPT, "ar", max_new_tokens=24, record=None).ids
    wrong = ref[:6] + [(ref[6] + 1) % target[0].config.vocab_size] + ref[7:]
    r = speclab.generate(target, ORACLE_PROMPT, "oracle", max_new_tokens=24, k=3, reference=wrong)
    assert r.ids == ref                                            # lossless whatever it drafts
    off = [rnd.info.get("off_reference", False) for rnd in r.trace.rounds]
    assert not off[0] and off[-1] and off == sorted(off)           # once off, off for good
    assert r.trace.totals.accepted < r.trace.totals.drafted        # the wrong token was rejected


@pytest.mark.parametrize("kw,msg", [(dict(reference="abc"), "reference must be a list of token ids"),
                                    (dict(reference=[1, -2]), "reference must be a list of token ids"),
                                    (dict(k=0), "k must be an integer >= 1")])
def test_the_oracle_rejects_bad_input(target, kw, msg):
    import speclab
    with pytest.raises(ValueError, match=msg):
        speclab.generate(target, ORACLE_PROMPT, "oracle", max_new_tokens=4, **kw)
    with pytest.raises(ValueError, match="does not run in a batch yet"):
        speclab.generate(target, [ORACLE_PROMPT, ORACLE_PROMPT], "oracle", max_new_tokens=4)


def test_suffix_trees_decode_what_ar_decodes(target):
    """Greedy, fp32: a frequency tree of point masses verified in one forward keeps ar's output."""
    import speclab
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n\ndef add(a,"
    want = speclab.generate(target, prompt, "ar", max_new_tokens=48, record=None).ids
    r = speclab.generate(target, prompt, "suffix", max_new_tokens=48, record="light", tree=True, min_prob=0.0,
                         max_k=8, gate="off")
    assert r.ids == want
    assert any(len(set(n.parent for n in rnd.nodes)) < len(rnd.nodes) for rnd in r.trace.rounds)   # a branch
    assert any(d.policy == "suffix" for rnd in r.trace.rounds for d in rnd.decisions)
