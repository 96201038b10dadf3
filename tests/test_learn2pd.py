"""Learn2PD: the filter's trainer on a toy dLLM, the dllm-learn2pd policy on the toy zoo's code-dllm
(its paired filter, speclab/zoo/code-dllm-learn2pd) with its scores in the trace, end-of-text
prediction, and one-line errors for bad parameters."""
import json

import pytest
import torch

import speclab
from speclab.decoding.dllm_adapt import Learn2PD
from speclab.decoding.dllm_policies import View
from speclab.decoding.registry import get_method
from speclab.models.learn2pd import FEATURES, Learn2PDFilter, features, load_filter, paired_filter

PROMPT = "def add(a, b):\n    return a + b\n\n\ndef copy_of_add(a, b):"


@pytest.fixture(scope="module")
def code():
    return speclab.load("code-dllm")


def test_the_trainer_runs_a_few_steps_and_writes_its_evaluation(code, tmp_path, monkeypatch):
    import speclab.train.learn2pd as t
    model, tok = code
    ids = tok(PROMPT, add_special_tokens=False)["input_ids"]
    monkeypatch.setattr(t, "training_prompts", lambda *a: [ids, ids[:-3], ids[2:], ids[:-6]])
    monkeypatch.setattr("speclab.models.zoo.load", lambda *a, **k: code)
    out = tmp_path / "f"
    t.main(["--dllm", "code-dllm", "--out", str(out), "--minutes", "0.5", "--gen-length", "16",
            "--block-length", "8", "--epochs", "5", "--held-frac", "0.25"])
    info = json.loads((out / "learn2pd.json").read_text())["speclab_learn2pd"]
    assert info["dllm"] == "code-dllm" and info["epochs"] == 5 and info["features"] == list(FEATURES)
    held = info["held_out"]
    assert held["n"] > 0 and {"auc", "at"} <= set(held["final"]) and held["p_x0"]["auc"] is not None
    assert {"precision", "recall", "committed"} <= set(held["final"]["at"][0])
    assert not list(out.glob("*.tmp"))                       # written beside its name, then renamed
    assert isinstance(load_filter(out), Learn2PDFilter)


def test_the_policy_runs_on_the_toy_dllm_and_records_its_scores(code):
    assert paired_filter("code-dllm").name == "code-dllm-learn2pd" and paired_filter("digits-dllm") is None
    r = speclab.run(code, PROMPT, "dllm-learn2pd", gen_length=16, block_length=8)
    ref = speclab.run(code, PROMPT, "dllm-lowconf", gen_length=16, block_length=8)
    t = r.trace
    assert t.totals.target_forwards <= ref.trace.totals.target_forwards and len(r.ids) == len(ref.ids)
    for s in t.denoise:
        lo, hi = s.block
        masked = [p for p in s.masked if lo <= p < hi]
        scored = {d.at: d for d in s.decisions if d.policy == "learn2pd filter"}
        assert sorted(scored) == masked                      # every masked slot of the block, every step
        assert all(d.threshold == 0.9 and 0 <= d.inputs["score"] <= 1 and "p" in d.inputs for d in scored.values())
        assert sorted(p for p, d in scored.items() if d.output in ("commit", "forced (best masked)")) == s.committed
        assert len(s.info["score"]) == hi - lo and s.committed
    again = speclab.run(code, PROMPT, "dllm-learn2pd", gen_length=16, block_length=8, threshold=0.3)
    assert again.trace.totals.target_forwards <= t.totals.target_forwards


class _Stub(torch.nn.Module):
    """A filter that scores nothing as final and every end of text as the end."""

    def scores(self, f):
        return torch.zeros(len(f)), f[:, FEATURES.index("is_eos")]


def test_end_of_text_commits_the_end_and_the_slots_after_it_wait():
    G, EOS, MASK = 8, 0, 99
    pol = Learn2PD(filter=None)
    pol.bind(None, EOS)
    pol._net, pol._stab = _Stub(), __import__("speclab.models.learn2pd", fromlist=["x"]).Stability(G)
    x0 = torch.tensor([5, 6, 7, EOS, EOS, 3, EOS, 4])
    conf = torch.tensor([0.2, 0.9, 0.3, 0.5, 0.4, 0.6, 0.3, 0.2])
    elig = torch.ones(G, dtype=torch.bool)
    v = View(0, G, (0, G), 0, elig, elig, x0, conf, conf * 10, torch.rand(G), None, conf, torch.full((G,), MASK),
             torch.zeros(G, dtype=torch.bool))
    ch = pol.select(v)
    assert ch.commit.nonzero().flatten().tolist() == [3] and ch.info["end_of_text"] == 3
    out = {d.at: d.output for d in ch.decisions if d.policy == "learn2pd filter"}
    assert out[3] == "end of text" and all(out[p] == "after end of text" for p in (4, 5, 6, 7))
    assert all(out[p] == "wait" for p in (0, 1, 2))
    # the end committed: the next step commits before it (the most confident), never after it
    v.tokens = torch.tensor([MASK] * 3 + [EOS] + [MASK] * 4)
    v.eligible = v.masked = v.tokens == MASK
    ch = pol.select(v)
    assert ch.commit.nonzero().flatten().tolist() == [1] and ch.info["forced"] == [1]
    pol.end_threshold = None                                 # off: the end of text is just another slot
    ch = pol.select(v)
    assert ch.info["end_of_text"] is None and ch.commit.nonzero().flatten().tolist() == [1]


def test_features_read_the_neighbourhood():
    masked = torch.tensor([False, True, True, False, True])
    conf = torch.tensor([1.0, 0.5, 0.7, 1.0, 0.2])
    f = features(conf, conf * 10, conf, torch.tensor([0, 2, 1, 0, 9]), masked, torch.tensor([1, 2, 0, 4, 5]), (0, 5), 0)
    col = {n: f[:, i].tolist() for i, n in enumerate(FEATURES)}
    assert col["left_conf"][1:3] == [1.0, 0.5] and col["right_conf"][4] == 0.0
    assert col["gap"][1] == 1 / 16 and col["gap"][2] == 2 / 16 and col["stable"][4] == 1.0
    assert col["is_eos"] == [0, 0, 1, 0, 0] and [col["after_eos"][i] for i in (1, 2, 4)] == [0, 0, 1]


@pytest.mark.parametrize("params, match", [
    ({"threshold": 0}, "threshold must be in"),
    ({"end_threshold": 1.5}, "end_threshold must be in"),
    ({"filter": "/no/such/filter"}, "is not a Learn2PD filter directory"),
])
def test_bad_parameters_give_one_line_errors(code, params, match):
    with pytest.raises(ValueError, match=match) as e:
        speclab.run(code, PROMPT, "dllm-learn2pd", gen_length=8, **params)
    assert "\n" not in str(e.value)


def test_a_dllm_without_a_filter_is_refused_in_one_line(capsys):
    from speclab.cli import main
    code = main(["run", "--target", "digits-dllm", "--method", "dllm-learn2pd", "--gen-length", "8",
                 "--prompt", "ADD 1+2="])
    err = capsys.readouterr().err
    assert code == 2 and "speclab train learn2pd" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_the_trainer_refuses_bad_options(capsys):
    from speclab.train.learn2pd import main
    with pytest.raises(SystemExit) as e:
        main(["--out", "x", "--minutes", "0"])
    assert e.value.code == 2 and "--minutes must be > 0" in capsys.readouterr().err
    assert get_method("dllm-learn2pd").config is Learn2PD
