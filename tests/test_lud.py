"""LUD (speclab.models.lud, decoding/drafters/lud.py, train/lud.py) on the code zoo with the shipped
toy fine-tune `code-lud`: the unit rule's cases, units in the trace and the figure, the verified mode
equal to the fine-tuned model's own greedy text (with the unverified default as the control that
leaves it), wrong pairings, and a trainer that runs."""
import pytest

import speclab
from conftest import trainer_runs
from speclab.decoding.drafters.lud import unit_end
from speclab.models import zoo
from speclab.models.lud import LudAdapter
from speclab.records import LexicalUnit


@pytest.fixture(scope="module")
def lud(target):
    """The toy zoo's fine-tune for code-target, with the target's tokenizer."""
    return zoo.load("code-lud")[0], target[1]


@pytest.mark.parametrize("tokens, conf, no_repeat, want", [
    ([5, 6, 7], [0.95, 0.91, 0.5], True, (2, "threshold")),
    ([5, 5, 7], [0.95, 0.99, 0.99], True, (1, "repeat")),
    ([5, 5, 7], [0.95, 0.99, 0.99], False, (3, "k")),
    ([4, 6, 7], [0.95, 0.99, 0.99], True, (0, "repeat")),        # repeats the round's own next token (4)
    ([5, 2, 7], [0.95, 0.99, 0.99], True, (1, "eos")),           # a guess never ends the text
], ids=["threshold", "repeat", "no-repeat", "repeats-next", "eos"])
def test_the_unit_ends_at_the_first_unsure_repeated_or_final_placeholder(tokens, conf, no_repeat, want):
    assert unit_end(tokens, conf, 0.9, 4, no_repeat, eos_id=2) == want
    assert unit_end(tokens, conf, 0.9, 2, no_repeat, eos_id=2) == (0, "eos")     # the next token ended the text


def test_units_are_recorded_drafted_next_round_and_drawn(target, lud, heldout_prompts):
    from speclab.figures.views import view_of
    r = speclab.generate(target, heldout_prompts[0], "lud", draft=lud, threshold=0.2, max_new_tokens=32)
    t = r.trace
    assert t.guarantee == "lossy" and t.totals.target_forwards == len(t.rounds)
    assert len(r.ids) / t.totals.target_forwards > 1.1                 # units of more than one token
    units = [LexicalUnit.of(x) for x in t.rounds]
    assert all(u is not None and u.lud_threshold == 0.2 and len(u.lud_slots) == lud[0].k - 1 for u in units)
    for u, nxt in zip(units, t.rounds[1:]):                             # a unit's tail is the next round's draft
        assert nxt.drafted == u.lud_span and nxt.path_tokens == [int(s[0]) for s in u.lud_slots[:u.lud_span]]
        assert all(s[1] >= 0.2 for s in u.lud_slots[:u.lud_span])
    step = max(range(len(t.rounds) - 1), key=lambda i: units[i].lud_span)
    fig = view_of(t).spec("lexical units").draw(t, step)
    bars = fig.data[0]
    assert list(bars.marker.color).count(bars.marker.color[0]) == units[step].lud_span
    assert "lexical units" not in view_of(speclab.generate(target, "def f(x):", "ar", max_new_tokens=4).trace).names


def test_verified_units_are_the_fine_tuned_models_own_greedy_text(target, lud, heldout_prompts):
    """rule=exact: token for token `ar` on the merged copy; the default rule's unverified guesses
    (at a low threshold) leave that text: the control the same comparison catches."""
    merged = (lud[0].merged(target[0]), target[1])
    prompt = heldout_prompts[0]
    ref = speclab.generate(merged, prompt, "ar", max_new_tokens=32, record=None).ids
    r = speclab.generate(target, prompt, "lud", draft=lud, rule="exact", threshold=0.2, max_new_tokens=32)
    assert r.ids == ref and r.trace.totals.accepted > 0
    loose = speclab.generate(target, prompt, "lud", draft=lud, threshold=0.05, max_new_tokens=32)
    assert loose.ids != ref
    assert any((n.verdicts or {}).get("exact") == "rejected" for x in loose.trace.rounds for n in x.nodes)


def test_wrong_pairings_say_what_to_do(target, lud):
    ppd = zoo.load("code-ppd")[0]
    with pytest.raises(ValueError, match="needs a LUD fine-tune.*speclab train lud"):
        speclab.generate(target, "def f(x):", "lud", draft=(ppd, target[1]))
    with pytest.raises(ValueError, match="lean forward"):
        speclab.generate(target, "def f(x):", "lud", draft=lud, backend="hf", max_new_tokens=4)
    with pytest.raises(ValueError, match="k must be an integer in 1"):
        speclab.generate(target, "def f(x):", "lud", draft=lud, k=9, max_new_tokens=4)
    with pytest.raises(ValueError, match="rule"):
        speclab.generate(target, "def f(x):", "lud", draft=lud, rule="typical", max_new_tokens=4)


def test_the_trainer_runs_and_its_fine_tune_loads_and_decodes(target, tmp_path, monkeypatch):
    """`speclab train lud --self-text N` on the toy target: a few steps, the saved fine-tune loads
    through the zoo (kind "lud") and decodes (barely moved, at a tiny learning rate: as `ar`)."""
    lud = trainer_runs(target, tmp_path, monkeypatch, "lud", "--anchors", "3", "--k", "3", "--rank", "2", "--lr", "1e-6")
    assert isinstance(lud, LudAdapter) and lud.k == 3 and lud.rank == 2
    train = (tmp_path / "lud" / "speclab_train.json").read_text()
    assert '"tau_good"' in train and '"drift"' in train
