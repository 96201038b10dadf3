"""Clover (speclab.models.clover, decoding/drafters/clover.py, train/clover.py) on the code zoo with
the shipped toy heads `code-clover`: lossless greedy and sampling, the training forward equal to the
drafting forward, what a round records, a wrong pairing, and a trainer that runs."""
import pytest
import torch

import speclab
from conftest import (greedy_identical_to_ar, one_distribution, sampled_drafts_are_point_mass, tokens_a_forward,
                      trainer_runs)
from speclab.models import zoo
from speclab.models.clover import CloverHeads, clover_config


@pytest.fixture(scope="module")
def clover(target):
    """The toy zoo's Clover heads for code-target, with the target's tokenizer."""
    return zoo.load("code-clover")[0], target[1]


@pytest.mark.parametrize("params", [dict(), dict(budget=4, width=2, depth=2), dict(paths=[[0], [1], [0, 0], [0, 0, 0]])],
                         ids=["defaults", "small-tree", "static-paths"])
def test_greedy_identical_to_ar(params, target, clover, heldout_prompts, heldout_ar):
    for r in greedy_identical_to_ar(target, heldout_prompts[:2], "clover", clover, params, heldout_ar):
        assert not r.trace.rounds[0].drafted            # round 1: the prompt has no hidden state yet


def test_the_trained_toy_accepts_more_than_one_token_a_round(target, clover, heldout_prompts):
    assert tokens_a_forward(target, heldout_prompts[0], "clover", draft=clover) > 1.3


def test_a_round_records_each_heads_candidates(target, clover, heldout_prompts):
    r = speclab.generate(target, heldout_prompts[1], "clover", draft=clover, max_new_tokens=16, record="light")
    n_prompt = len(r.trace.prompt_ids)
    rnd = r.trace.rounds[1]
    assert {n.source for n in rnd.nodes} <= {f"clover{d}@h{n_prompt - 1}" for d in (1, 2, 3)}
    heads = [d for d in rnd.decisions if d.policy == "clover"]
    first = heads[0]
    assert first.inputs["head"] == 1 and first.inputs["read"] == r.trace.rounds[0].emitted   # the pending token
    cands = first.inputs["candidates"]
    assert len(cands) == 3 and all(0 < p <= 1 for _, p in cands) and cands[0][1] >= cands[-1][1]
    kept = {n.token for n in rnd.nodes if n.depth == 1}
    assert set(first.output) == kept and kept <= {t for t, _ in cands}
    assert max(d.inputs["head"] for d in heads) == max(n.depth for n in rnd.nodes)
    none = speclab.generate(target, heldout_prompts[1], "clover", draft=clover, max_new_tokens=16, record=None)
    assert none.ids == r.ids


def test_sampled_trees_are_point_mass(target, clover):
    """Sampled, clover's tree of its heads' top choices tells the rule no q: its law is the point-mass
    tree walk's, tested with power in test_sampling_power.py."""
    sampled_drafts_are_point_mass(target, "clover", draft=clover, budget=4, width=2, depth=2)


def test_training_forward_equals_drafting_forward(target, clover):
    """train_logits (teacher-forced, causal over the window) gives at position t what the drafter
    computes from the augmenting block's kept K / V and one decoder step per head."""
    base, _ = target
    head = clover[0]
    T, t = 14, 9
    tok = torch.randint(0, 500, (1, T))
    with torch.no_grad():
        x = base(input_ids=tok, output_hidden_states=True).hidden_states[-1]   # post-norm; any states will do
        ref = head.train_logits(x, tok)                                        # (K, 1, T, N)
        q, k, v = head.aug_qkv(x[0, :t + 1], torch.arange(t + 1))
        g = head.aug_out(x[0, t:t + 1], q[:, -1:], k, v, causal=False)
        for j in (1, 2, 3):
            g = head.decode(g, tok[0, t + j:t + j + 1], j)
            got = head.block(g, j) @ head.lm_head.weight.t()
            assert torch.allclose(got[0], ref[j - 1, 0, t], atol=1e-4)


def test_a_new_clover_starts_as_the_medusa_heads_it_reads(target):
    from speclab.models.heads import build_medusa, head_config
    base, _ = target
    torch.manual_seed(0)
    ids = torch.arange(300)
    medusa = build_medusa(base, head_config(base.config, "medusa", 2), ids)
    for w in medusa.w2:
        torch.nn.init.normal_(w.weight, std=0.02)
    c = CloverHeads(base, clover_config(base.config, 2), ids)
    c.load_state_dict(medusa.state_dict(), strict=False)
    x = torch.randn(1, 6, base.config.hidden_size)
    with torch.no_grad():
        want = medusa.hidden(x[0]) @ medusa.lm_head.weight.t()                 # (K, T, N)
        got = c.train_logits(x, torch.randint(0, 300, (1, 6)))[:, 0]
    assert torch.allclose(got, want, atol=1e-4)


def test_wrong_pairings_say_what_to_do(target, clover):
    from speclab.models.heads import build_medusa, head_config
    medusa = build_medusa(target[0], head_config(target[0].config, "medusa", 2), torch.arange(300))
    with pytest.raises(ValueError, match="needs Clover heads.*speclab train clover"):
        speclab.generate(target, "def f(x):", "clover", draft=(medusa, target[1]))
    with pytest.raises(ValueError, match="use depth <= 3"):
        speclab.generate(target, "def f(x):", "clover", draft=clover, depth=5)
    with pytest.raises(ValueError, match="at most 3 ranks"):
        speclab.generate(target, "def f(x):", "clover", draft=clover, paths=[[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]])


def test_the_trainer_runs_and_its_heads_load_and_draft(target, tmp_path, monkeypatch):
    """`speclab train clover --self-text N` on the toy target: the target writes its text, a few
    steps run, and the saved heads load through the zoo and decode identically to ar."""
    from speclab.train import clover as tc
    heads = trainer_runs(target, tmp_path, monkeypatch, "clover", "--heads", "2", "--ffn", "0")
    assert isinstance(heads, CloverHeads) and heads.n_heads == 2
    loss0 = None
    base = target[0]
    head = tc.build(base, torch.arange(400), tc.get_args(["--heads", "2", "--ffn", "0"]))
    x = torch.randn(2, 12, base.config.hidden_size)
    tok, lp, m = one_distribution()
    opt = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(8):
        loss, _ = tc.clover_loss(head, x, tok, lp, m)
        loss0 = float(loss.detach()) if loss0 is None else loss0
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < loss0
