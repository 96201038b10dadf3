"""Judge decoding (rules/judge.py, models/judge.py, train/judge.py): the OR of the exact verdict and
the probe's, on runs of the toy zoo and its probe (speclab/zoo/code-judge); the state the trainer
reads is the state a verify hands the rule; the trainer end to end on the toy pair."""
from __future__ import annotations

import json

import pytest
import torch

import speclab
from speclab.decoding.acceptance import Sampler
from speclab.decoding.rules import get_rule, rule_params
from speclab.models.judge import JudgeProbe, load_judge, save_judge

PROMPT = "def parse(line):"
KW = dict(max_new_tokens=40, record="light")


def rescued(trace) -> int:
    return sum(1 for r in trace.rounds for n in r.nodes
               if n.verdicts and n.verdicts["judge"] == "accepted" and n.verdicts["exact"] == "rejected")


def test_every_verdict_is_exact_or_the_probe_and_a_low_threshold_rescues(one_thread):
    """Greedy: each tested node's judge verdict is exact's OR score > threshold (the first in try
    order wins); a threshold no score reaches gives ar's text; a low one rescues tokens, and the text
    departs from ar's exactly there."""
    ar = speclab.generate("code-target", PROMPT, "ar", **KW)
    strict = speclab.generate("code-target", PROMPT, "draft-model", draft="code-draft", k=4, rule="judge",
                              rule_params=dict(judge="code-judge", threshold=0.999999), **KW)
    assert strict.ids == ar.ids and rescued(strict.trace) == 0
    # a threshold just under the best score exact rejected: the run reaches that test as the strict
    # run did (the same text up to it), so at least that token is rescued
    thr = 0.99 * max(d.inputs["score"] for r in strict.trace.rounds for d in r.decisions
                     for n in r.nodes if n.id == d.at and n.verdicts["exact"] == "rejected")
    loose = speclab.generate("code-target", PROMPT, "draft-model", draft="code-draft", k=4, rule="judge",
                             rule_params=dict(judge="code-judge", threshold=thr), **KW)
    t = loose.trace
    assert rescued(t) > 0 and loose.ids != ar.ids and t.params["rule"] == "judge"
    for r in t.rounds:
        by_node = {d.at: d for d in r.decisions if d.policy == "judge"}
        for n in r.nodes:
            if n.verdicts:
                d = by_node[n.id]
                assert d.threshold == thr and 0 <= d.inputs["score"] <= 1
                ok = n.verdicts["exact"] == "accepted" or d.inputs["score"] > thr
                assert (n.decision == "accepted") == ok
    first = next(i for i, (a, b) in enumerate(zip(loose.ids, ar.ids)) if a != b)
    emitted = [tok for r in t.rounds for tok in r.path_tokens + [r.emitted]][:len(loose.ids)]
    assert emitted == loose.ids and first < len(ar.ids)


def test_sampling_accepts_what_exact_accepts_with_the_same_draw(one_thread):
    """Under sampling a token the exact test passes is never rejected; a rejected one had a score at
    or below the threshold."""
    r = speclab.generate("code-target", PROMPT, "draft-model", draft="code-draft", k=4, rule="judge",
                         rule_params=dict(judge="code-judge", threshold=0.3), temperature=0.8, seed=3, **KW)
    tested = [(n, d) for rd in r.trace.rounds for n in rd.nodes if n.verdicts
              for d in rd.decisions if d.at == n.id]
    assert tested
    for n, d in tested:
        if n.verdicts["exact"] == "accepted":
            assert n.decision == "accepted"
        if n.decision == "rejected":
            assert d.inputs["score"] <= 0.3


def test_the_trainers_state_is_the_state_the_verify_hands_the_rule(target, draft, one_thread):
    """train/judge.py's packed forward (X and swapped windows under a 4-D mask) gives the target's
    last-layer state at Z_t as a plain forward over X_<t + Z_t does, and the verify's capture
    (what h_at reads) is that state too."""
    from speclab.models.backends import make_lm
    from speclab.train.judge import _windows
    model, tok = target
    model = model.float()
    X = torch.tensor(tok(PROMPT + "\n    return line.split(',')").input_ids)
    t, w = 4, 3
    z = torch.full((len(X),), 7)
    got = {}
    L = model.config.num_hidden_layers
    hook = model.model.layers[L - 1].register_forward_hook(lambda _m, _i, o: got.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    try:
        with torch.no_grad():
            lp = model(X[None]).logits[0].float().log_softmax(-1)
            h, nll = _windows(model, X, lp, z, [t], w, got)
            plain = torch.cat([X[:t], torch.tensor([7]), X[t + 1:t + w]])
            ref = model(plain[None]).logits[0].float().log_softmax(-1)
            h_ref = got["h"][0, t].float()
    finally:
        hook.remove()
    assert torch.allclose(h[0], h_ref, atol=1e-4)
    assert float(nll[0]) == pytest.approx(float(-ref[t:t + w].gather(-1, X[t + 1:t + w + 1, None]).sum()), abs=1e-3)
    lm = make_lm(model, "target", "auto")
    lm.reset()
    lm.forward(X[:t])
    lm.capture_layers = (L,)
    lm.forward(torch.tensor([7, 8]), parents=[-1, 0], n_prefix=0)
    assert torch.allclose(lm.captured[L][0, 0].float(), h_ref, atol=1e-3)


def test_refusals_are_one_line(tmp_path, target):
    model, _ = target
    with pytest.raises(ValueError, match="no judge probe for the target"):
        get_rule("judge").make(rule_params("judge", {}), type("M", (), {"name_or_path": "nowhere", "config": model.config})())
    with pytest.raises(ValueError, match="neither a zoo name nor a directory"):
        get_rule("judge").make(rule_params("judge", {"judge": str(tmp_path / "none")}), model)
    save_judge(JudgeProbe(model.config.hidden_size + 1), tmp_path / "wide", {"target": "code-target", "threshold": 0.5})
    with pytest.raises(ValueError, match="reads states of width"):
        get_rule("judge").make(rule_params("judge", {"judge": str(tmp_path / "wide")}), model)
    walk = get_rule("judge").make(rule_params("judge", {"judge": "code-judge", "threshold": 0.5}), model)
    with pytest.raises(ValueError, match="does not hand on"):
        walk({-1: [0]}, [1], {}, lambda n: torch.zeros(model.config.vocab_size), Sampler(0.0), None, lambda: 0.5)
    with pytest.raises(ValueError, match="0 < threshold < 1"):
        get_rule("judge").make(rule_params("judge", {"judge": "code-judge", "threshold": 1.5}), model)


def test_the_trainer_writes_a_probe_with_its_held_out_evaluation(tmp_path, one_thread):
    from speclab.cli import main
    out = tmp_path / "probe"
    assert main(["train", "judge", "--target", "code-target", "--draft", "code-draft", "--dtype", "float32",
                 "--chat", "0", "--code", "6", "--max-new", "32", "--window", "4",
                 "--cache", str(tmp_path / "text.safetensors"), "--out", str(out)]) == 0
    info = json.loads((out / "judge.json").read_text())["speclab_judge"]
    assert info["target"] == "code-target" and info["command"].startswith("speclab train judge")
    assert {"auc", "precision", "recall", "base_rate"} <= set(info["held_out"]) and 0 < info["threshold"] <= 1
    probe = load_judge(out)
    assert probe.hidden_size == info["hidden_size"] and float(probe.sd.min()) > 0
