"""FiRST on the code zoo (code-first, routers trained on code-target): the prefill runs every layer
and the routers read its states; every decoded token then skips the chosen whole layers, the same
for the whole request. The choice is the routers' top scores on the prompt's own features; the text
is a plain decode with that fixed skip set after a full prefill, token for token; nothing skipped is
`ar` bit for bit; the fixed mode takes the part's label frequencies; the trainer runs on a tiny slice."""
from __future__ import annotations

import re

import pytest
import torch

import speclab
from speclab.decoding.drafters.first import FirstDrafter, choose, load_routers, prompt_features, resolve_routers
from speclab.decoding.registry import get_method, guarantee
from speclab.models.lean.forward import LeanLM
from speclab.models.lean.skips import SkipSet
from speclab.records import RouterChoice
from speclab.trace import replay

PROMPTS, NEW = ("def parse(line):", "class Stack:\n    def push(self, x):"), 20


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """Bit-for-bit comparisons at one thread (a team size chosen from the load may change how torch's
    products round between forwards)."""
    monkeypatch.setenv("SPECLAB_THREADS", "1")


def scores_of(target, prompt_ids: list[int]) -> list:
    """The zoo routers' scores on a full prefill of the prompt, computed here apart from the drafter."""
    routers, _ = load_routers(resolve_routers(None, target[0]))
    lm = LeanLM(target[0], "check")
    L = len(lm.layers)
    lm.capture_layers = tuple(range(1, L - 1))
    lm.forward(torch.tensor(prompt_ids))
    with torch.no_grad():
        s = routers(prompt_features(lm.captured, L)[None])[0].tolist()
    return [None] + s + [None]


def test_the_rule_takes_the_budget_of_top_scores_at_or_above_the_threshold():
    s = [None, 0.9, 0.1, 0.7, 0.7, 0.3, None]
    assert choose(s, 2, 0.0) == [1, 3]                    # ties to the lower layer
    assert choose(s, 3, 0.0) == [1, 3, 4]
    assert choose(s, 3, 0.75) == [1]                      # only 0.9 reaches the threshold
    assert choose(s, 0, 0.0) == [] and choose(s, 9, 0.0) == [1, 2, 3, 4, 5]   # never the ends


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_routers_choose_from_the_prompt_and_decoding_skips_that_set_after_a_full_prefill(target, prompt):
    r = speclab.generate(target, prompt, "first", max_new_tokens=NEW, record="full")
    t = r.trace
    L = len(target[0].model.layers)
    assert t.guarantee == "lossy" and replay(t) == r.ids and t.totals.target_forwards == len(t.rounds) == NEW
    c = RouterChoice.of(t.rounds[0])
    want = scores_of(target, t.prompt_ids)
    assert c.router_mode == "router" and c.router_scores[0] is None and c.router_scores[-1] is None
    assert c.router_scores[1:-1] == pytest.approx(want[1:-1], abs=1e-4)
    assert c.router_skipped == choose(c.router_scores, c.router_budget, 0.0)
    assert len(c.router_skipped) == round(0.25 * L)
    mask = "".join("x" if i in c.router_skipped else "." for i in range(L))
    assert t.rounds[0].info["skip"] == "." * L and all(rd.info["skip"] == mask for rd in t.rounds[1:])
    (d,) = t.rounds[0].decisions
    assert d.policy == "first" and d.output == mask and d.threshold == 0.0
    assert all(RouterChoice.of(rd) is None for rd in t.rounds[1:])
    # the same text from a plain decode: full prefill, then one token a forward less the chosen layers
    lm = LeanLM(target[0], "check")
    ids = t.prompt_ids + r.ids
    out = [int(lm.forward(torch.tensor(t.prompt_ids))[-1].argmax())]
    for k in range(1, NEW):
        out.append(int(lm.forward(torch.tensor([ids[len(t.prompt_ids) + k - 1]]),
                                  skip=SkipSet.layers(c.router_skipped))[-1].argmax()))
    assert out == r.ids


def test_the_choice_depends_on_the_prompt(target):
    a, b = (RouterChoice.of(speclab.generate(target, p, "first", max_new_tokens=2).trace.rounds[0]) for p in PROMPTS)
    assert a.router_scores != b.router_scores


@pytest.mark.parametrize("kw", [dict(threshold=1.0), dict(skip_ratio=0.0)])
def test_skipping_nothing_is_ar_bit_for_bit(target, kw):
    ar = speclab.generate(target, PROMPTS[0], "ar", max_new_tokens=NEW)
    r = speclab.generate(target, PROMPTS[0], "first", max_new_tokens=NEW, **kw)
    assert r.ids == ar.ids and RouterChoice.of(r.trace.rounds[0]).router_skipped == []


def test_the_fixed_mode_takes_the_parts_most_often_labelled_layers_for_every_prompt(target):
    _, info = load_routers(resolve_routers(None, target[0]))
    freq = [None] + info["label_freq"] + [None]
    chosen = [RouterChoice.of(speclab.generate(target, p, "first", max_new_tokens=2, adaptive=False).trace.rounds[0])
              for p in PROMPTS]
    assert all(c.router_mode == "fixed" and c.router_scores == freq for c in chosen)
    assert chosen[0].router_skipped == chosen[1].router_skipped == choose(freq, chosen[0].router_budget, 0.0)


@pytest.mark.parametrize("kw,words", [
    (dict(skip_ratio=1.5), "skip_ratio must be in [0, 1]"),
    (dict(threshold=2), "threshold must be in [0, 1]"),
    (dict(routers="no-such-part"), "routers='no-such-part' is neither a zoo name nor a directory"),
    (dict(routers="code-draft"), "holds no FiRST routers"),
])
def test_bad_parameters_are_refused_in_one_line(target, kw, words):
    with pytest.raises(ValueError, match=re.escape(words)) as e:
        speclab.generate(target, PROMPTS[0], "first", max_new_tokens=4, **kw)
    assert "\n" not in str(e.value)


def test_routers_for_another_shape_are_refused(target, tmp_path):
    from speclab.decoding.drafters.first import Routers, save_routers
    save_routers(Routers(5, 16), tmp_path, {"target": "other", "label_freq": [0.5] * 3})
    with pytest.raises(ValueError, match="trained for 5 layers of width 16"):
        FirstDrafter(target[0], routers=str(tmp_path))


def test_the_row_is_lossy_and_transformers_forward_refuses_it(target):
    assert guarantee("first") == "lossy" and "FiRST" in get_method("first").summary
    with pytest.raises(ValueError, match="lean forward only"):
        speclab.generate(target, PROMPTS[0], "first", max_new_tokens=4, backend="hf")


def test_the_trainer_labels_fits_and_writes_routers_the_method_runs(target, tmp_path):
    from speclab.train.first import main
    out, labels = tmp_path / "routers", str(tmp_path / "labels.safetensors")
    argv = ["--target", "code-target", "--out", str(out), "--chat", "0", "--code", "8", "--max-new", "6",
            "--max-steps", "4", "--eval-every", "2", "--labels", labels]
    assert main(argv) == 0
    first_freq = load_routers(out)[1]["label_freq"]
    assert main(argv) == 0                                  # the second fit reads the cached labels
    model, info = load_routers(out)
    assert info["label_freq"] == first_freq
    with pytest.raises(SystemExit, match="holds labels for"):
        main(argv[:-2] + ["--max-new", "7", "--labels", labels])
    L = len(target[0].model.layers)
    assert (info["n_layers"], info["budget"], len(info["label_freq"])) == (L, round(0.25 * L), L - 2)
    assert sum(info["label_freq"]) == pytest.approx(info["budget"])          # each prompt labels `budget` layers
    assert {"router", "fixed", "even", "labels", "full"} <= set(info["held_out"])
    assert (out / "speclab_train.json").is_file()
    r = speclab.generate(target, PROMPTS[0], "first", max_new_tokens=4, routers=str(out))
    assert len(RouterChoice.of(r.trace.rounds[0]).router_skipped) == info["budget"]


def test_the_router_figure_draws_the_scores_and_the_chosen_mask_in_every_view(target):
    from speclab.figures.first import router_figure
    from speclab.figures.views import view_of
    t = speclab.generate(target, PROMPTS[1], "first", max_new_tokens=4).trace
    c = RouterChoice.of(t.rounds[0])
    fig = router_figure(t, 2)
    bars = {b.name: (list(b.x), list(b.y)) for b in fig.data if b.type == "bar"}
    assert bars["skipped while decoding"] == (c.router_skipped, [c.router_scores[i] for i in c.router_skipped])
    runs = [i for i, s in enumerate(c.router_scores) if s is not None and i not in c.router_skipped]
    assert bars["runs"][0] == runs
    (mask,) = [h for h in fig.data if h.type == "heatmap"]
    assert [i for i, v in enumerate(mask.z[0]) if v] == c.router_skipped
    assert "layer routers" in view_of(t).names
    assert "layer routers" not in view_of(speclab.generate(target, PROMPTS[1], "ar", max_new_tokens=2).trace).names
