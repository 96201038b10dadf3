"""dParallel: the entropy-threshold policy (dllm-dparallel) and its EntropyCommit record, the
certainty-forcing loss and complementary masks, the trainer for a few steps on digits-dllm, and the
shipped toy digits-dparallel decoding in fewer steps than the dLLM it was distilled from."""
import json

import pytest
import torch

import speclab
from speclab.decoding.dllm_policies import View
from speclab.decoding.dparallel import EntropyThreshold
from speclab.figures.dparallel import certainty_figure, convergence
from speclab.figures.views import view_of
from speclab.records import EntropyCommit
from speclab.trace import Trace
from speclab.train import digits
from speclab.train.dparallel import certainty_forcing, pair_masks


def view(entropy, eligible):
    G = len(entropy)
    z = torch.zeros(G)
    return View(step=0, total_steps=G, block=(0, G), step_in_block=0, eligible=torch.tensor(eligible),
                masked=torch.tensor(eligible), x0=torch.zeros(G, dtype=torch.long), conf=z, logit_margin=z, rand=z,
                prev_x0=None, entropy=torch.tensor(entropy))


def test_commits_every_slot_under_the_threshold_and_records_them_lowest_first():
    pol = EntropyThreshold()                                   # 0.5 nats, the paper's
    assert pol.plan(5, 1) == 5
    ch = pol.select(view([0.1, 0.7, 0.3, 2.0, 0.0], [True, True, True, True, False]))
    assert ch.commit.tolist() == [True, False, True, False, False]
    rec = EntropyCommit(**{k: ch.info[k] for k in EntropyCommit.keys()})
    assert rec.by_entropy == [0, 2, 1, 3] and rec.by_entropy_nats == [0.1, 0.3, 0.7, 2.0]
    assert rec.under_threshold == 2 and rec.entropy_threshold == 0.5 and ch.info["forced"] == []
    low = EntropyThreshold(threshold=0.05).select(view([0.1, 0.7, 0.1, 2.0], [True] * 4))
    assert low.commit.tolist() == [True, False, False, False]      # none under it: the lowest, leftmost, forced
    assert low.info["under_threshold"] == 0 and low.info["forced"] == [0]
    with pytest.raises(ValueError, match="threshold must be > 0"):
        EntropyThreshold(threshold=0).plan(4, 1)


def test_the_loss_forces_certainty_only_where_the_model_is_right_and_masks_pair_up():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]], requires_grad=True)
    y = torch.tensor([0, 0])                                   # slot 0 right, slot 1 wrong
    loss, m = certainty_forcing(logits, y, weight=2.0, temperature=0.5)
    ce = torch.nn.functional.cross_entropy(logits, y)
    p = (logits[0] / 0.5).softmax(-1)
    assert torch.isclose(loss, ce + 2.0 * -(p * p.log()).sum()) and m["masked_acc"] == 0.5
    loss.backward()
    only_ce = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), logits)[0]
    assert torch.allclose(logits.grad[1], only_ce[1])         # the wrong slot gets no entropy gradient
    fn = pair_masks(3, 0.5, torch.Generator().manual_seed(0))
    maskable = torch.tensor([False, True, True, True, True, True, True, False])
    a = [fn(i, maskable) for i in range(3)]
    b = [fn(3 + i, maskable) for i in range(3)]
    for x, c in zip(a, b):
        assert not (x & c).any() and torch.equal(x | c, maskable)


def test_the_trainer_runs_a_few_steps_and_writes_the_part(tmp_path):
    from speclab.train.dparallel import main
    out = tmp_path / "dp"
    main(["--dllm", "digits-dllm", "--out", str(out), "--prompts", "8", "--max-steps", "2", "--batch", "4",
          "--data-cache", "none", "--held-frac", "0.25", "--minutes", "2"])
    info = json.loads((out / "speclab_train.json").read_text())
    assert info["trajectories"] == 8 and info["held_out_trajectories"] == 2 and info["steps"] in (0, 2)
    assert info["command"].startswith("speclab train dparallel --dllm digits-dllm")
    assert {"masked_ce", "certain_right", "certain_wrong", "score"} <= set(info["log"][-1])
    model, tok = speclab.load(str(out))
    assert speclab.run((model, tok), "SUM 12=", "dllm-dparallel", gen_length=8, record=None).ids


@pytest.fixture(scope="module")
def sums():
    return [p["prompt"] for p in digits.eval_prompts(6) if p["task"] == "SUM"]


def test_the_distilled_toy_decodes_in_fewer_steps_and_the_view_shows_each_slot(sums):
    base, dist = speclab.load("digits-dllm"), speclab.load("digits-dparallel")
    fw = {}
    for name, m in (("base", base), ("dist", dist)):
        runs = [speclab.run(m, p, "dllm-dparallel", gen_length=8, record="full") for p in sums]
        fw[name] = sum(r.trace.totals.target_forwards for r in runs)
        assert all(digits.check(p, m[1].decode(r.ids)) for p, r in zip(sums, runs)) or name == "base"
    assert fw["dist"] < fw["base"]
    t = Trace.from_json(json.dumps(runs[0].trace.to_dict()))
    for s in t.denoise:
        rec = EntropyCommit.of(s)
        under = [p for p, h in zip(rec.by_entropy, rec.by_entropy_nats) if h <= rec.entropy_threshold]
        assert sorted(s.committed) == sorted(under or rec.by_entropy[:1])
    c = convergence(t)
    assert sum(c["used"].values()) == len(c["cells"]) and len(c["commits"]) == 8
    assert "certainty per slot" in [f.name for f in view_of(t).summary]
    fig = certainty_figure(t, 0)
    assert f"8 slots in {len(t.denoise)} steps" in fig.layout.title.text
