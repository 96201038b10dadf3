"""Falcon (speclab.models.falcon, decoding/drafters/falcon.py, train/falcon.py) on the code zoo with
the shipped toy head `code-falcon`: lossless greedy and sampling, the drafting forwards equal to the
training forward (teacher-forced, then with the glance's predicted features), which forward and slot
drafted each node, a wrong pairing, and a trainer that runs."""
import pytest
import torch

import speclab
from conftest import (greedy_identical_to_ar, one_distribution, sampled_drafts_are_point_mass, tokens_a_forward,
                      trainer_runs)
from speclab.models import zoo
from speclab.models.falcon import FalconHead


@pytest.fixture(scope="module")
def falcon(target):
    """The toy zoo's Falcon head for code-target, with the target's tokenizer."""
    return zoo.load("code-falcon")[0], target[1]


@pytest.mark.parametrize("params, n", [(dict(), 2), (dict(budget=10, width=2, depth=5, threshold=None), 1)],
                         ids=["defaults", "deep-tree"])
def test_greedy_identical_to_ar(params, n, target, falcon, heldout_prompts, heldout_ar):
    greedy_identical_to_ar(target, heldout_prompts[:n], "falcon", falcon, params, heldout_ar, record=None)


def test_the_trained_toy_accepts_more_than_one_token_a_round(target, falcon, heldout_prompts):
    assert tokens_a_forward(target, heldout_prompts[0], "falcon", draft=falcon) > 1.3


def test_each_node_records_its_forward_and_slot(target, falcon, heldout_prompts):
    r = speclab.generate(target, heldout_prompts[1], "falcon", draft=falcon, max_new_tokens=16, record="light",
                         budget=10, width=2, depth=5, threshold=None)
    t = len(r.trace.prompt_ids) - 1
    rnd = r.trace.rounds[1]
    assert max(n.depth for n in rnd.nodes) == 5                 # three forwards: depths 1-2, 3-4, 5
    for n in rnd.nodes:                                         # k = 2: forward (d+1)//2, slot 2 at even depths
        assert n.source == f"falcon{(n.depth + 1) // 2}.{2 - n.depth % 2}@h{t}"
    per_node = [d for d in rnd.decisions if d.policy == "falcon"]
    assert len(per_node) == len(rnd.nodes)
    for d, n in zip(per_node, rnd.nodes):
        assert (d.inputs["forward"], d.inputs["slot"]) == ((n.depth + 1) // 2, 2 - n.depth % 2)
        assert d.inputs["mask"] == (n.depth % 2 == 0) and d.output == n.token
    assert rnd.info["k"] == 2 and rnd.info["head_forwards"] == 3
    none = speclab.generate(target, heldout_prompts[1], "falcon", draft=falcon, max_new_tokens=16, record=None,
                            budget=10, width=2, depth=5, threshold=None)
    assert none.ids == r.ids


def test_drafting_forwards_equal_the_training_forward(target, falcon, heldout_prompts):
    """A round's node probabilities q: depths 1-2 are train_forward's slots at the last committed
    position t (teacher-forced); depths 3-4 under the depth-2 node (a, b) are its slots at t+2 when
    the real entries at t+1, t+2 read a, b and the features slots 1 and 2 predicted at t: the inputs
    the glance feeds pass 2."""
    base, _ = target
    head = falcon[0]
    r = speclab.generate(target, heldout_prompts[0], "falcon", draft=falcon, max_new_tokens=4, record="light",
                         budget=12, width=3, depth=4, threshold=None)
    rnd = r.trace.rounds[1]
    ids = list(r.trace.prompt_ids) + [r.trace.rounds[0].emitted]
    n = len(ids)
    t = n - 2
    got = []                                # the last layer's output, pre-norm (hidden_states[-1] is normed)
    hook = base.model.layers[-1].register_forward_hook(lambda _m, _i, o: got.append(o[0] if isinstance(o, tuple) else o))
    with torch.no_grad():
        base(input_ids=torch.tensor([ids]))
        hook.remove()
        f = head.feature([got[0][0]])                                      # (n, C); row n-1 is never read at t
        o = head.train_forward(f[None], torch.tensor([ids]))[:, 0]         # (k, n, C)
        q1 = head.logits(o[:, t]).softmax(-1)                              # (k, N): depths 1, 2
        pos = {int(v): i for i, v in enumerate(head.lm_head.head_ids)}
        nodes = rnd.nodes
        checked = 0
        for i, nd in enumerate(nodes):
            if nd.depth <= 2:
                assert nd.q == pytest.approx(float(q1[nd.depth - 1, pos[nd.token]]), abs=2e-3)
            elif nd.depth == 3:
                b = nodes[nd.parent]
                a = nodes[b.parent]
                f2 = torch.cat([f[:n - 1], head.rms(o[:, t]), f[:1]])          # (n+2, C): predicted at t+1, t+2
                o2 = head.train_forward(f2[None], torch.tensor([ids + [a.token, b.token]]))[:, 0]
                q3 = head.logits(o2[:, t + 2]).softmax(-1)
                assert nd.q == pytest.approx(float(q3[0, pos[nd.token]]), abs=2e-3)
                kids = [m for m in nodes if m.parent == i]
                for m in kids:                                             # depth 4: the mask slot at t+3
                    assert m.q == pytest.approx(float(q3[1, pos[m.token]]), abs=2e-3)
                checked += 1 + len(kids)
    assert checked > 0


def test_sampled_trees_are_point_mass(target, falcon):
    """Sampled, falcon's tree of its heads' top choices tells the rule no q: its law is the point-mass
    tree walk's, tested with power in test_sampling_power.py."""
    sampled_drafts_are_point_mass(target, "falcon", draft=falcon, budget=4, width=2, depth=2, threshold=None)


def test_wrong_pairings_say_what_to_do(target):
    from speclab.models.heads import build_medusa, head_config
    medusa = build_medusa(target[0], head_config(target[0].config, "medusa", 2), torch.arange(300))
    with pytest.raises(ValueError, match="needs a Falcon head.*speclab train falcon"):
        speclab.generate(target, "def f(x):", "falcon", draft=(medusa, target[1]))


def test_the_glance_keeps_the_target_features_in_chosen_blocks():
    from speclab.train.falcon import glance

    class K2:
        k = 2

        @staticmethod
        def rms(x):
            return x
    f = torch.zeros(1, 8, 1)
    o = torch.arange(1, 17, dtype=torch.float).view(2, 1, 8, 1)            # slot s at t: 8 (s-1) + t + 1
    gen = torch.Generator().manual_seed(0)
    got = glance(K2, f, o, torch.tensor([0]), 0.5, gen)[0, :, 0]
    # block [2, 4) reads slot 1 and 2 at position 1; block [4, 6) at 3; the first block keeps f
    assert got.tolist() == [0, 0, 2, 10, 4, 12, 6, 14]
    assert glance(K2, f, o, torch.tensor([100]), 0.5, gen).abs().sum() == 0    # every block glanced


def test_the_trainer_runs_and_its_head_loads_and_drafts(target, tmp_path, monkeypatch):
    """`speclab train falcon --self-text N` on the toy target: the target writes its text, a few CSGD
    steps run, and the saved head loads through the zoo and decodes identically to ar."""
    from speclab.train import falcon as tf
    head = trainer_runs(target, tmp_path, monkeypatch, "falcon", "--n-layers", "1", "--ffn", "64")
    assert isinstance(head, FalconHead) and head.k == 2 and len(head.layers) == 1
    base = target[0]
    torch.manual_seed(0)
    head = tf.build(base, torch.arange(400), tf.get_args(["--n-layers", "1", "--ffn", "64"]))
    f = head.rms(torch.randn(2, 12, base.config.hidden_size))
    tok, lp, m = one_distribution()
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(24):                     # Adam's first steps move the zero-started projections a lot
        loss, _ = tf.csgd_loss(head, f, f, tok, lp, m, 0.3, gen)
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert max(losses[-4:]) < losses[0]
