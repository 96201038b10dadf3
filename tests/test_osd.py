"""OSD: the online draft is lossless (greedy identical to `ar` on the toy zoo with updates happening,
training the head's adapter or the whole draft; the joint of two sampled tokens at T = 1 with a
trained draft of either kind), an update lowers the loss on the buffered positions and changes the
draft's predictions there while the shared draft model and its packed weights stay as shipped, the
buffer stays within its bound, the losses are the divergences they name, the state lives in the
store the caller owns, and the figure draws the updates and versions the trace recorded."""
from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import speclab
from sampling_law import next_two_joint, own_text
from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.drafters.lookup import SuffixHistory
from speclab.decoding.drafters.osd import (POLICY, OnlineDraft, OnlineDrafts, OsdDrafter, WholeDraft, divergence,
                                          online_drafts)
from speclab.decoding.speculative import decode
from speclab.figures.osd import osd_figure, osd_updates
from speclab.figures.views import view_of
from speclab.models.adapter import build_draft
from speclab.models.backends import make_lm
from speclab.models.lean.forward import LeanLM
from speclab.trace import Trace, replay

from test_rules import chi2_p    # tests/ is on the path, as for conftest

pytestmark = pytest.mark.usefixtures("one_thread")     # a toy's tiny products (conftest)

NEW = 40
FAST = dict(train="head", interval=4, buffer=16, steps=4)   # updates every few rounds on a short run
WHOLE = dict(train="all", interval=8, buffer=8, steps=4, lr=1e-3)   # the whole draft, the buffer cleared each update


def updates(trace: Trace) -> list:
    return [d for r in trace.rounds for d in r.decisions if d.policy == POLICY]


@pytest.fixture(scope="module")
def runs(target, draft, heldout_prompts):
    """Two prompts decoded by ar, then by osd sharing one store (the second continues the first's
    draft), with the shared draft model's weights and packed copy read before and after."""
    before = {k: v.clone() for k, v in draft[0].state_dict().items()}
    frozen = speclab.generate(target, heldout_prompts[0], "draft-model", draft=draft, max_new_tokens=NEW)
    packed = dict(draft[0].__dict__.get("_speclab_packed", {}))
    prompts = heldout_prompts[:2]
    refs = [speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None).ids for p in prompts]
    store = OnlineDrafts()
    osd = [speclab.generate(target, p, "osd", draft=draft, max_new_tokens=NEW, history=store, **FAST)
           for p in prompts]
    return dict(refs=refs, osd=osd, store=store, before=before, packed=packed, frozen=frozen)


def test_greedy_is_identical_to_ar_on_the_toy_zoo_while_the_draft_updates(runs, tmp_path):
    for r, ref in zip(runs["osd"], runs["refs"]):
        assert r.ids == ref
    t = runs["osd"][0].trace
    ups = updates(t)
    assert len(ups) >= 2 and all(d.output == "update" for d in ups)
    versions = [r.info["draft_version"] for r in t.rounds]
    assert versions[0] == 0 and versions == sorted(versions) and versions[-1] >= 1
    for d in ups:       # the round after an update drafts with the new version
        assert set(d.inputs) >= {"buffer", "loss_before", "loss_after", "steps", "lr"}
        if d.at + 1 < len(t.rounds):
            assert t.rounds[d.at + 1].info["draft_version"] == d.inputs["version"]
    assert sum(r.info.get("update_s", 0) > 0 for r in t.rounds) == len(ups)
    back = Trace.load(t.save(tmp_path / "osd.json"))
    assert replay(back) == t.output_ids and [r.decisions for r in back.rounds] == [r.decisions for r in t.rounds]


def test_the_second_request_continues_the_draft_the_first_trained_and_no_history_starts_fresh(runs, target, draft,
                                                                                               heldout_prompts):
    first, second = (r.trace for r in runs["osd"])
    assert second.rounds[0].info["draft_version"] == first.rounds[-1].info["draft_version"] > 0
    assert "history" not in second.params                           # the caller's object is not recorded
    alone = speclab.generate(target, heldout_prompts[1], "osd", draft=draft, max_new_tokens=8, **FAST)
    assert alone.trace.rounds[0].info["draft_version"] == 0
    h = SuffixHistory()                                             # what the bench and the dashboard pass
    assert online_drafts(h) is online_drafts(h) and isinstance(online_drafts(h), OnlineDrafts)


def test_an_update_lowers_the_loss_and_moves_the_drafts_predictions_but_not_the_shared_draft(runs, target, draft,
                                                                                              heldout_prompts):
    ups = updates(runs["osd"][0].trace) + updates(runs["osd"][1].trace)
    assert all(d.inputs["loss_after"] < d.inputs["loss_before"] for d in ups)
    (state,) = runs["store"].values()
    with torch.no_grad():           # the buffered positions: the adapted draft's loss is the shipped one's, less
        shipped = state.loss(B=torch.zeros_like(state.B))
        assert state.loss() < shipped
        M = state.size
        moved = (state.base[:M].float() + state.delta(state.h[:M])).argmax(-1) != state.base[:M].float().argmax(-1)
        assert moved.any()                                          # some draft predictions changed
    after = draft[0].state_dict()
    assert all(torch.equal(after[k], v) for k, v in runs["before"].items())
    assert dict(draft[0].__dict__.get("_speclab_packed", {})) == runs["packed"]  # no re-pack, same copies
    again = speclab.generate(target, heldout_prompts[0], "draft-model", draft=draft, max_new_tokens=NEW)
    assert [r.path_tokens for r in again.trace.rounds] == [r.path_tokens for r in runs["frozen"].trace.rounds]


def test_the_buffer_keeps_its_bound_and_an_update_trains_on_it_whole(target, draft, heldout_prompts):
    store = OnlineDrafts()
    for p in heldout_prompts[2:4]:
        r = speclab.generate(target, p, "osd", draft=draft, max_new_tokens=NEW, history=store, positions="all",
                             train="head", buffer=8, interval=4, steps=2, rank=4)
    (state,) = store.values()
    C, N = draft[0].config.hidden_size, draft[0].config.vocab_size
    bound = 8 * (4 * C + 6 * N) + 4 * 4 * (C + N) * 3               # buffer rows + A, B and their two moments
    assert state.size == 8 and state.nbytes == bound
    assert all(d.inputs["buffer"] <= 8 for d in updates(r.trace))
    assert len(updates(r.trace)) >= 2


@pytest.fixture(scope="module")
def whole(target, draft, heldout_prompts):
    """Two prompts decoded by ar, then by osd training the whole draft (one store, so the second
    continues the first's copy), with the shared draft model's weights and packed copy read before."""
    before = {k: v.clone() for k, v in draft[0].state_dict().items()}
    speclab.generate(target, heldout_prompts[0], "draft-model", draft=draft, max_new_tokens=8)   # packs it
    packed = dict(draft[0].__dict__.get("_speclab_packed", {}))
    prompts = heldout_prompts[4:6]
    refs = [speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None).ids for p in prompts]
    store = OnlineDrafts()
    osd = [speclab.generate(target, p, "osd", draft=draft, max_new_tokens=NEW, history=store, **WHOLE)
           for p in prompts]
    return dict(refs=refs, osd=osd, store=store, before=before, packed=packed)


def test_the_whole_draft_is_lossless_and_trains_a_copy_the_caller_owns_not_the_shared_draft(whole, draft):
    for r, ref in zip(whole["osd"], whole["refs"]):
        assert r.ids == ref
    first, second = (r.trace for r in whole["osd"])
    ups = updates(first) + updates(second)
    assert len(ups) >= 2 and all(d.inputs["train"] == "all" and d.inputs["loss"] == "kl" for d in ups)
    assert all(d.inputs["loss_after"] < d.inputs["loss_before"] for d in ups)
    assert second.rounds[0].info["draft_version"] == first.rounds[-1].info["draft_version"] > 0
    after = draft[0].state_dict()
    assert all(torch.equal(after[k], v) for k, v in whole["before"].items())
    assert dict(draft[0].__dict__.get("_speclab_packed", {})) == whole["packed"]  # no re-pack, same copies
    (state,) = whole["store"].values()
    assert isinstance(state, WholeDraft)
    mine = dict(state.model.named_parameters())
    assert any(not torch.equal(mine[k], v) for k, v in draft[0].named_parameters())   # the copy learnt
    assert all(torch.equal(d, m) for d, m in zip(state.drafting, state.params))  # it drafts what trained
    assert 0 < state.size <= WHOLE["buffer"]
    assert set(state.texts) == set(state.seq[:state.size].tolist())       # only the texts entries read


def test_a_table_the_draft_shares_with_its_target_is_shared_by_every_copy_and_never_trained():
    """A draft over a base (smollm2-draft's form: the base's embedding, a head of some of its rows):
    the whole-draft state trains the layers and the head, and every copy reads the base's table."""
    cfg = dict(vocab_size=24, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
               max_position_embeddings=64)
    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **cfg)).eval()
    small = build_draft(base, LlamaConfig(num_hidden_layers=1, speclab_adapter={"shared": ["model.embed_tokens.weight"]},
                                          **cfg), torch.arange(16)).eval()
    table, shipped = base.model.embed_tokens.weight, {k: v.clone() for k, v in small.state_dict().items()}
    state = WholeDraft(small, 16, 4)
    assert state.model.model.embed_tokens.weight is table                     # shared, not copied
    assert len(state.params) == len(list(small.parameters())) - 1 and len(state.frozen) == 1
    state.add(logp=torch.randn(2, 16).log_softmax(-1), seq=0, rows=[3, 5], text=list(range(1, 9)))
    mine = state.copy()
    assert mine.model.model.embed_tokens.weight is table and mine.frozen[0] is state.frozen[0]
    head = mine.model.lm_head.weight.clone()
    before, after = mine.update(2, 1e-2, "kl", 0.5)
    assert after < before and not torch.equal(mine.model.lm_head.weight, head)    # the head's copy trained
    assert torch.equal(table, shipped["model.embed_tokens.weight"])
    assert all(torch.equal(v, small.state_dict()[k]) for k, v in shipped.items())      # the shipped draft as it was
    assert not torch.equal(state.drafting[-1], mine.drafting[-1])                      # the store's state untouched


def test_the_losses_are_the_divergences_they_name():
    g = torch.Generator().manual_seed(0)
    logp, logq = (torch.randn(5, 11, generator=g, dtype=torch.float64).log_softmax(-1) for _ in range(2))
    kl_div = torch.nn.functional.kl_div
    assert torch.allclose(divergence(logq, logp, "kl"), kl_div(logq, logp, log_target=True, reduction="none").sum(-1))
    assert torch.allclose(divergence(logq, logp, "rkl"), kl_div(logp, logq, log_target=True, reduction="none").sum(-1))
    for beta in (0.1, 0.5, 0.9):
        p, q = logp.exp(), logq.exp()
        m = beta * p + (1 - beta) * q
        want = beta * (p * (p / m).log()).sum(-1) + (1 - beta) * (q * (q / m).log()).sum(-1)
        assert torch.allclose(divergence(logq, logp, "jsd", beta), want)
        assert (want > 0).all() and (want <= -(beta * math.log(beta) + (1 - beta) * math.log(1 - beta))).all()
        assert torch.allclose(divergence(logp, logp, "jsd", beta), torch.zeros(5, dtype=torch.float64))


def test_the_whole_draft_under_jsd_lowers_its_loss_and_stays_lossless(target, draft, heldout_prompts):
    p = heldout_prompts[6]
    ref = speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None).ids
    r = speclab.generate(target, p, "osd", draft=draft, max_new_tokens=NEW, **WHOLE | dict(loss="jsd", beta=0.9, positions="all"))
    assert r.ids == ref
    ups = updates(r.trace)
    assert ups and all(d.inputs["loss"] == "jsd" and d.inputs["beta"] == 0.9 for d in ups)
    assert all(d.inputs["loss_after"] < d.inputs["loss_before"] for d in ups)


class ShippedQ(OsdDrafter):
    """A broken osd: the trained draft's tokens, verified against the q the shipped draft gives them
    (the copy drafts, the rule is told the shipped model's distribution)."""

    def propose(self, ctx):
        tree = super().propose(ctx)
        shipped = make_lm(self.draft_model, "draft")
        rows = shipped.forward(torch.tensor(ctx.ids + tree.tokens[:-1]), logits_to_keep=len(tree.tokens))
        for i, row in enumerate(rows):
            tree.set_q(i - 1, warp(row, self.sampler))
        return tree


def sampled_pairs(train: str, drafter=OsdDrafter, n: int = 1000):
    """The first two tokens of n runs at T = 1 of a one-layer draft with a random (non-zero) adapter,
    or its whole copy's weights moved, verified by the exact rule, and the target's joint law."""
    V, sampler = 24, Sampler(1.0, top_k=4)
    cfg = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
               max_position_embeddings=128, initializer_range=0.3)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **cfg)).eval()
    small = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **cfg)).eval()   # the target's first layer
    small.load_state_dict(model.state_dict(), strict=False)
    lm = LeanLM(model, "target")
    prompt = own_text(lm)
    _, joint = next_two_joint(model, prompt, sampler)
    if train == "head":
        adapted = OnlineDraft(32, V, 4, 8, "cpu")
        adapted.B = torch.randn(V, 4, generator=torch.Generator().manual_seed(1)) * 0.5
        key = (*SuffixHistory.key_of(small), "head", 32, V, 4, 8)
    else:                           # the whole draft's copy moved away from the shipped weights
        adapted = WholeDraft(small, V, 8)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in adapted.model.parameters():
                p += 0.1 * torch.randn(p.shape, generator=g)
        key = (*SuffixHistory.key_of(small), "all", V, 8)
    adapted.version = 1
    counts, accepted = torch.zeros(V, V, dtype=torch.float64), 0
    for seed in range(n):
        store = OnlineDrafts()
        store.put(key, adapted.copy())
        d = drafter(small, k=2, rank=4, buffer=8, interval=8, train=train, history=store)
        new, rounds, _ = decode(lm, d, prompt, 2, sampler, seed=seed, record=None)
        counts[new[0], new[1]] += 1
        accepted += len(rounds[0].accepted)
        assert rounds[0].info["draft_version"] == 1
    assert 0 < accepted < 2 * n                                   # drafts both kept and refused
    exp, obs = (joint / joint.sum() * n).flatten(), counts.flatten()
    return exp, obs


@pytest.mark.parametrize("train", ["head", "all"])
def test_the_first_two_sampled_tokens_follow_the_targets_joint_distribution(train):
    """Chi-square of the drawn pairs against the target's joint: p-value > 0.001."""
    exp, obs = sampled_pairs(train)
    assert obs[exp == 0].sum() == 0                               # never a pair the target cannot emit
    keep = exp > 0
    assert chi2_p(obs[keep], exp[keep] / obs.sum()) > 1e-3


def test_the_trained_drafts_tokens_verified_against_the_shipped_q_are_caught():
    """The negative control: the same test on 731 draws (N_BROKEN) rejects the broken variant."""
    exp, obs = sampled_pairs("all", ShippedQ, n=731)
    keep = exp > 0
    assert obs[~keep].sum() > 0 or chi2_p(obs[keep], exp[keep] / obs.sum()) <= 1e-3


def test_steps_lr_and_buffer_default_by_what_is_trained(draft):
    head, whole = OsdDrafter(draft[0], train="head"), OsdDrafter(draft[0])
    assert (head.steps, head.lr, head.capacity) == (8, 0.01, 128)
    assert (whole.steps, whole.lr, whole.capacity) == (2, 1e-4, 16)
    assert OsdDrafter(draft[0], train="all", lr=0.002, buffer=64).lr == 0.002


@pytest.mark.parametrize("kw,words", [
    (dict(rank=0), "rank must be an integer >= 1"),
    (dict(interval=2.5), "interval must be an integer >= 1"),
    (dict(lr=0.0), r"lr must be a number in \(0, 1\)"),
    (dict(positions="some"), "positions must be one of rejected, all"),
    (dict(interval=64, buffer=32), r"interval \(64\) must be <= buffer \(32\)"),
    (dict(history=object()), "history must be a speclab OnlineDrafts or SuffixHistory"),
    (dict(train="body"), "train must be one of head, all"),
    (dict(loss="tv"), "loss must be one of kl, rkl, jsd"),
    (dict(beta=1.0), r"beta must be a number in \(0, 1\)"),
])
def test_bad_parameters_are_one_line_errors_that_say_what_to_do(draft, kw, words):
    with pytest.raises(ValueError, match=words) as e:
        OsdDrafter(draft[0], **kw)
    assert "\n" not in str(e.value)


def test_the_figure_marks_each_update_and_steps_the_version(runs):
    t = runs["osd"][0].trace
    fig = osd_figure(t, step=3)
    marks = next(tr for tr in fig.data if tr.name == "update")
    assert sum(x is not None for x in marks.x) == 2 * len(osd_updates(t))
    assert [x for x in marks.x if x is not None][::2] == [i + 1.5 for i, _ in osd_updates(t)]
    version = next(tr for tr in fig.data if tr.name == "draft version")
    assert list(version.y) == [r.info["draft_version"] for r in t.rounds]
    assert list(next(tr for tr in fig.data if tr.name == "current").x) == [4, 4]
    assert "online draft" in [f.name for f in view_of(t).summary]
    assert "online draft" not in [f.name for f in view_of(runs["frozen"].trace).summary]
