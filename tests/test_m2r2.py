"""M2R2 (speclab.models.m2r2, decoding/drafters/m2r2.py, train/m2r2.py) on the code zoo with the shipped
toy accelerator `code-m2r2`: an untrained accelerator is layer-skip's exit, the decode step equals the
training forward, the trained stream agrees with the final layer earlier than the plain exits, the
exit record and its figure, a wrong pairing, and a trainer that runs. Greedy identity with ar on every
lean family is the registry-wide tests/test_archs.py's; the sampled chain's law is ChainDrafter's
(tests/test_sampling_power.py, its chain case)."""
import pytest
import torch

import speclab
from speclab.models import zoo
from speclab.models.m2r2 import Accelerator, m2r2_config

PROMPT = "def parse_args(argv):\n    parser = argparse."


@pytest.fixture(scope="module")
def m2r2(target):
    """The toy zoo's accelerator for code-target, with the target's tokenizer."""
    return zoo.load("code-m2r2")[0], target[1]


def drafted(result) -> list[list[int]]:
    return [[n.token for n in r.nodes] for r in result.trace.rounds]


def test_an_untrained_accelerator_drafts_what_the_plain_exit_drafts(target):
    """B starts at zero: the fast stream is the target's first E layers, so its drafts are layer-skip's
    at exit_layer E, round for round, and so are their tokens."""
    acc = Accelerator(target[0], m2r2_config(target[0].config, 3, 4, 8.0))
    ours = speclab.generate(target, PROMPT, "m2r2", draft=(acc, target[1]), max_new_tokens=16)
    plain = speclab.generate(target, PROMPT, "layer-skip", exit_layer=3, max_new_tokens=16)
    assert drafted(ours) == drafted(plain) and ours.ids == plain.ids
    assert ours.trace.totals.drafted > 0


def test_the_draft_step_equals_the_training_forward(target, m2r2):
    """Round 2 drafts its first token from the pending token, every committed row before it in the
    target's cache: its q is the training forward's fast exit at that row (slow keys and values
    before it, its own at it)."""
    from speclab.train.m2r2 import streams
    base, acc = target[0], m2r2[0]
    r = speclab.generate(target, PROMPT, "m2r2", draft=m2r2, max_new_tokens=6, record="light")
    rnd = r.trace.rounds[1]
    ids = list(r.trace.prompt_ids) + r.trace.rounds[0].tokens
    with torch.no_grad():
        _, fast = streams(base, acc, torch.tensor([ids]))
        q = base.lm_head(base.model.norm(fast[-1][0, -1])).float().softmax(-1)
    assert rnd.nodes[0].token == int(q.argmax()) and rnd.nodes[0].q == pytest.approx(float(q.max()), abs=1e-4)


def test_the_trained_stream_agrees_with_the_final_layer_earlier(m2r2):
    """The shipped part's held-out measurement: the fast stream after each of its layers agrees with
    the final layer more often than the plain exit after as many layers."""
    align = m2r2[0].alignment()
    E = m2r2[0].layers
    assert len(align["plain"]) == 8 and len(align["fast"]) == E
    assert all(f > p for f, p in zip(align["fast"], align["plain"]))


def test_each_exit_is_recorded_with_its_confidence_and_drawn(target, m2r2):
    from speclab.figures.m2r2 import stream_figure
    from speclab.figures.views import view_of
    from speclab.records import StreamExit
    t_hold = 0.5
    r = speclab.generate(target, PROMPT, "m2r2", draft=m2r2, max_new_tokens=16, record="light",
                         exit_threshold=t_hold, min_exit=2)
    assert r.ids == speclab.generate(target, PROMPT, "ar", max_new_tokens=16, record=None).ids   # early exits too
    t, E = r.trace, m2r2[0].layers
    recs = [StreamExit.of(x) for x in t.rounds]
    assert recs[0].m2r2_align_fast == m2r2[0].alignment()["fast"]
    assert all(x.m2r2_align_plain is None for x in recs[1:])          # the curves once, on the first round
    exits = [(l, c) for x in recs for l, c in zip(x.m2r2_exits, x.m2r2_conf)]
    assert len(exits) == t.totals.drafted and all(x.m2r2_threshold == t_hold and x.m2r2_depth == E for x in recs)
    assert all(2 <= l <= E for l, _ in exits) and all(c >= t_hold for l, c in exits if l < E)
    assert any(l < E for l, _ in exits)                                # some token exits before the last layer
    decisions = [d for x in t.rounds for d in x.decisions if d.policy == "m2r2-exit"]
    assert [(d.output, d.inputs["confidence"]) for d in decisions] == exits
    assert "accelerated stream" in view_of(t).names
    fig = stream_figure(t, 1)
    assert list(fig.data[1].y) == m2r2[0].alignment()["fast"]
    assert sum(len([y for y in d.y if y is not None]) for d in fig.data[2:5]) == len(exits)


def test_wrong_pairings_and_settings_say_what_to_do(target, m2r2):
    with pytest.raises(ValueError, match="needs an M2R2 accelerator.*speclab train m2r2"):
        speclab.generate(target, "def f(x):", "m2r2", draft="code-draft")
    with pytest.raises(ValueError, match="exit_after must be an integer in 1..4"):
        speclab.generate(target, "def f(x):", "m2r2", draft=m2r2, exit_after=6)
    with pytest.raises(ValueError, match="layers .* must be in 1..7"):
        m2r2_config(target[0].config, 8, 4, 8.0)
    with pytest.raises(ValueError, match="trained for a target with hidden_size = 320, code-target-s has 128: "
                                         r"train one for it \(speclab train m2r2\)"):
        m2r2[0].check_target(zoo.load("code-target-s")[0], "code-target-s")


def test_the_trainer_runs_and_its_accelerator_loads_and_drafts(target, tmp_path, monkeypatch):
    """`speclab train m2r2 --self-text N` on the toy target: the target writes its text, a few steps
    run, and the saved accelerator (its alignment in its config) loads through the zoo and decodes
    identically to ar."""
    from speclab.train import clover, m2r2 as train_m2r2
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(clover, "CACHE", str(tmp_path / "text"))
    out = tmp_path / "m2r2-test"
    assert train_m2r2.main(["--target", "code-target", "--self-text", "4", "--max-new", "12", "--out", str(out),
                            "--layers", "2", "--rank", "4", "--seq-len", "24", "--batch", "2", "--positions", "4",
                            "--max-steps", "2", "--minutes", "1", "--threads", "1", "--held-frac", "0.25"]) == 0
    acc = zoo.load(str(out))[0]
    assert isinstance(acc, Accelerator) and acc.layers == 2 and acc.rate == 4.0
    assert len(acc.alignment()["plain"]) == 8 and len(acc.alignment()["fast"]) == 2
    ref = speclab.generate(target, "def f(x):", "ar", max_new_tokens=12, record=None).ids
    assert speclab.generate(target, "def f(x):", "m2r2", draft=(acc, target[1]), max_new_tokens=12).ids == ref
