"""A draft tree sized to the machine (speclab.decoding.costs; eagle's budget=auto): the choice
itself on given costs, the measured curve on a real (toy zoo) model, and the record a run keeps.
Its greedy identity to ar is tests/test_heads.py's eagle-fitted case."""
import pytest
from conftest import toy_heads

import speclab
from speclab.decoding.costs import fit_nodes, verify_curve
from speclab.figures.treefit import fit_figure, has_fits
from speclab.records import TreeFit

SCORES = [0.9, 0.7, 0.5, 0.3, 0.2, 0.1]                 # cumulative draft probabilities, best first


def test_free_rows_keep_every_node_and_dear_rows_keep_none():
    flat = {T: 1.0 for T in range(1, 11)}
    assert fit_nodes(SCORES, flat)[0] == len(SCORES)      # extra rows cost nothing: verify them all
    steep = {T: float(T) for T in range(1, 11)}           # each row a whole forward
    n, gain, cost = fit_nodes(SCORES, steep)
    assert (n, gain, cost) == (0, 1.0, 1.0)               # no tree pays: the root alone


def test_the_fit_follows_the_machine():
    """AVX512-BF16-like costs (6 rows 1.3) keep more of the same tree than AVX2-like ones (6 rows
    1.8), and a dearer draft (d) favours a bigger tree: its cost is paid either way."""
    bf16 = {1: 1.0, 2: 1.03, 3: 1.07, 4: 1.12, 5: 1.2, 6: 1.3, 7: 1.45, 8: 1.6, 9: 1.75, 10: 1.9}
    avx2 = {1: 1.0, 2: 1.1, 3: 1.25, 4: 1.4, 5: 1.6, 6: 1.8, 7: 2.0, 8: 2.2, 9: 2.4, 10: 2.6}
    fast, slow = fit_nodes(SCORES, bf16)[0], fit_nodes(SCORES, avx2)[0]
    assert fast > slow >= 1
    assert fit_nodes(SCORES, avx2, draft_cost=1.0)[0] >= slow
    n, gain, cost = fit_nodes(SCORES, avx2)
    assert gain == pytest.approx(1 + sum(SCORES[:n])) and cost == avx2[1 + n]
    assert fit_nodes(SCORES, avx2, scale=0.2)[0] <= slow  # a head found overconfident: fewer nodes


def test_the_measured_curve_is_a_cost_per_row(target):
    curve = verify_curve(target[0], rows=(1, 2, 4, 8), reps=3, ctx_len=32)
    assert list(curve) == [1, 2, 4, 8] and curve[1] == 1.0
    assert all(a <= b for a, b in zip(curve.values(), list(curve.values())[1:]))   # more rows never cost less


def test_a_fitted_run_records_its_choice_and_draws_it(target, heldout_prompts):
    head = (toy_heads(target)["eagle"], target[1])
    r = speclab.generate(target, heldout_prompts[0], "eagle", draft=head, max_new_tokens=24, budget="auto",
                         record="light")
    fits = [TreeFit.of(x) for x in r.trace.rounds[1:]]
    assert fits and all(f is not None and 0 <= f.fit_nodes <= 9 for f in fits)
    for x, f in zip(r.trace.rounds[1:], fits):
        assert len(x.nodes) >= f.fit_nodes                # the kept nodes (ancestor-closed) were verified
        assert f.fit_expect >= 1.0 and f.fit_cost >= 1.0
    assert fits[0].fit_curve is not None and len(fits[0].fit_curve) == 10 and fits[1].fit_curve is None
    assert has_fits(r.trace) and "tree sized to this machine" in fit_figure(r.trace, 2).layout.title.text
    with pytest.raises(ValueError, match="budget must be a node count or 'auto'"):
        speclab.generate(target, heldout_prompts[0], "eagle", draft=head, max_new_tokens=4, budget="big")


@pytest.mark.parametrize("costs", [[1.2, 1.3], [1, 0.5], []])
def test_given_costs_are_checked(target, heldout_prompts, costs):
    head = (toy_heads(target)["eagle"], target[1])
    with pytest.raises(ValueError, match="costs is c\\(T\\)"):
        speclab.generate(target, heldout_prompts[0], "eagle", draft=head, max_new_tokens=4, budget="auto", costs=costs)


def test_prompt_lookup_sized_to_the_machine_is_ar_and_records_its_choice(target, heldout_prompts):
    """prompt-lookup[k=auto] on a toy target, this machine's curve measured: the same tokens as ar
    (the verify decides), each drafting round's TreeFit kept (the chain's length), the figure shown."""
    prompt = heldout_prompts[0] + heldout_prompts[0]                  # something to copy
    ar = speclab.generate(target, prompt, "ar", max_new_tokens=32, record="light")
    r = speclab.generate(target, prompt, "prompt-lookup", k="auto", max_new_tokens=32, record="light")
    assert r.text == ar.text
    fits = [(x, TreeFit.of(x)) for x in r.trace.rounds if "fit_nodes" in x.info]
    assert fits and fits[0][1].fit_curve is not None
    assert all(len(x.nodes) == f.fit_nodes <= 16 and f.fit_cost >= 1.0 for x, f in fits)
    assert has_fits(r.trace) and "tree sized to this machine" in fit_figure(r.trace, 1).layout.title.text
