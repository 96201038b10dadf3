"""ADED: the tri-gram table on a hand example, the explore / exploit search and its recorded
decisions, lossless greedy decoding on the toy zoo, and the target's joint distribution of the
first two tokens under sampling (a random Llama from a config, chi-square)."""
from __future__ import annotations

import pytest
import torch

import speclab
from sampling_law import next_two_joint, own_text, pair_counts, pooled_chisquare
from speclab.decoding.acceptance import Sampler
from speclab.decoding.drafters.aded import EXPLOIT, EXPLORE, AdedDrafter
from speclab.decoding.speculative import Context
from speclab.trace import Trace, replay


pytestmark = pytest.mark.usefixtures("one_thread")     # a toy's tiny products (conftest)


def ctx(ids):
    return Context(ids=list(ids), n_prompt=len(ids), pending=1, device=torch.device("cpu"))


def started(ids, **kw) -> AdedDrafter:
    d = AdedDrafter(**kw)
    d.begin(ctx(ids), None, None, None)
    return d


def test_the_table_counts_each_bigrams_continuations_from_the_prompt_and_each_commit():
    d = started([1, 2, 3, 1, 2, 4, 1, 2])
    assert d.table == {(1, 2): {3: 1, 4: 1}, (2, 3): {1: 1}, (3, 1): {2: 1}, (2, 4): {1: 1}, (4, 1): {2: 1}}
    d.propose(ctx([1, 2, 3, 1, 2, 4, 1, 2, 4, 9]))          # two committed tokens: (1, 2) -> 4, (2, 4) -> 9
    assert d.table[(1, 2)] == {3: 1, 4: 2} and d.table[(2, 4)] == {1: 1, 9: 1}
    assert d.candidates((1, 2)) == ([(4, 2), (3, 1)], 3)    # most frequent first
    assert d.candidates((2, 4)) == ([(9, 1), (1, 1)], 2)    # ties: the most recent first


def test_a_full_row_evicts_its_least_frequent_continuation():
    d = started([5, 6, 7, 5, 6, 7, 5, 6, 8, 5, 6], keep=2, width=2)
    assert d.table[(5, 6)] == {7: 2, 8: 1}
    d.propose(ctx([5, 6, 7, 5, 6, 7, 5, 6, 8, 5, 6, 9]))     # 9 evicts 8 (count 1), not 7
    assert d.table[(5, 6)] == {7: 2, 9: 1}


def test_the_search_exploits_a_sure_chain_and_explores_an_uncertain_bigram():
    sure = started([1, 2, 3, 4, 5, 6, 1, 2])                # every bigram has one continuation
    t = sure.propose(ctx([1, 2, 3, 4, 5, 6, 1, 2]))
    assert t.tokens == [3, 4, 5, 6, 1] and t.parents == [-1, 0, 1, 2, 3] and set(t.source) == {EXPLOIT}
    ids = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]       # (1, 2) -> 3 three times, 4 once
    greedy = started(ids, c_explore=0.0).propose(ctx(ids))
    assert greedy.tokens[0] == 3 and 4 not in greedy.tokens and set(greedy.source) == {EXPLOIT}
    bold = started(ids, c_explore=2.0).propose(ctx(ids))
    root = [i for i, p in enumerate(bold.parents) if p == -1]
    assert [bold.tokens[i] for i in root] == [3, 4] and bold.source[root[1]] == EXPLORE
    assert bold.info[EXPLORE] >= 1 and len(bold) == 5


def test_each_added_node_records_its_bigram_counts_scores_and_choice():
    ids = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2]
    t = started(ids, c_explore=2.0).propose(ctx(ids))
    assert [d.at for d in t.decisions] == list(range(len(t)))
    assert [d.output for d in t.decisions] == t.source
    d = next(d for d in t.decisions if d.output == EXPLORE)
    assert d.policy == "aded" and d.inputs["bigram"] == [1, 2] and d.inputs["counts"] == [[3, 3], [4, 1]]
    scores = dict(d.inputs["scores"])
    assert d.threshold == scores[3] and d.inputs["score"] == scores[4] > scores[3]   # 4 beat the most frequent
    assert started([7]).propose(ctx([7])).tokens == []     # one token: no bigram, no draft


@pytest.mark.parametrize("kw,words", [
    (dict(k=0), "k must be an integer >= 1"),
    (dict(width=0), "width must be an integer >= 1"),
    (dict(budget=2.5), "budget must be an integer >= 1"),
    (dict(c_explore=-1.0), "c_explore must be a finite number >= 0"),
    (dict(c_explore=float("inf")), "c_explore must be a finite number >= 0"),
    (dict(width=13), r"width \(13\) must be <= keep \(12\)"),
])
def test_bad_parameters_are_one_line_errors_that_say_what_to_do(kw, words):
    with pytest.raises(ValueError, match=words) as e:
        AdedDrafter(**kw)
    assert "\n" not in str(e.value)


def test_greedy_is_identical_to_ar_on_the_toy_zoo_and_records_its_choices(target, heldout_prompts, tmp_path):
    prompts = heldout_prompts[:2]
    refs = [speclab.generate(target, p, "ar", max_new_tokens=40, record=None).ids for p in prompts]
    for prompt, ref in zip(prompts, refs):
        r = speclab.generate(target, prompt, "aded", max_new_tokens=40)
        assert r.ids == ref, f"aded diverged from greedy ar on {prompt[:40]!r}"
    assert [b.ids for b in speclab.generate(target, prompts, "aded", max_new_tokens=40, record=None)] == refs  # a batch
    assert r.trace.totals.accepted > 0
    choices = [d.output for rd in r.trace.rounds for d in rd.decisions]
    assert set(choices) <= {EXPLOIT, EXPLORE} and EXPLOIT in choices
    assert all(len(rd.decisions) == rd.drafted for rd in r.trace.rounds)
    back = Trace.load(r.trace.save(tmp_path / "aded.json"))
    assert replay(back) == r.trace.output_ids
    assert [rd.decisions for rd in back.rounds] == [rd.decisions for rd in r.trace.rounds]


def test_the_first_two_sampled_tokens_follow_the_targets_joint_distribution():
    """Point-mass drafts (several root siblings, a chain below) verified by the exact rule at T=1:
    the first two tokens are distributed as the target's joint (chi-square, p-value > 0.001)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from speclab.models.lean.forward import LeanLM
    V, n, sampler = 24, 1500, Sampler(1.0, top_k=4)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                                         initializer_range=0.3)).eval()
    lm = LeanLM(model, "target")
    prompt = own_text(lm)
    p1, joint = next_two_joint(model, prompt, sampler)
    tree = started(prompt).propose(ctx(prompt))
    roots = [tok for tok, par in zip(tree.tokens, tree.parents) if par == -1]
    assert len(roots) >= 2 and all(p1[t] > 0 for t in roots)   # siblings the target may take
    counts, firsts = pair_counts(lm, AdedDrafter, prompt, sampler, n, V)
    accepted = sum(len(r.accepted) > 0 for r in firsts)
    assert 0 < accepted < n                                    # drafts both kept and refused
    assert pooled_chisquare(joint.flatten() / joint.sum() * n, counts.flatten()) > 1e-3
