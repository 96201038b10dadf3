"""OSD: the online draft is lossless (greedy identical to `ar` on the toy zoo with updates happening;
the joint of two sampled tokens at T = 1 with an adapted draft), an update lowers the loss on the
buffered positions and changes the draft's predictions there while the shared draft model and its
packed weights stay as shipped, the buffer stays within its bound, the state lives in the store the
caller owns, and the figure draws the updates and versions the trace recorded."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import speclab
from sampling_law import next_two_joint, own_text
from speclab.decoding.acceptance import Sampler
from speclab.decoding.drafters.lookup import SuffixHistory
from speclab.decoding.drafters.osd import POLICY, OnlineDraft, OnlineDrafts, OsdDrafter, online_drafts
from speclab.decoding.speculative import decode
from speclab.figures.osd import osd_figure, osd_updates
from speclab.figures.views import view_of
from speclab.models.lean.forward import LeanLM
from speclab.trace import Trace, replay

from test_rules import chi2_p    # tests/ is on the path, as for conftest

pytestmark = pytest.mark.usefixtures("one_thread")     # a toy's tiny products (conftest)

NEW = 40
FAST = dict(interval=4, buffer=16, steps=4)             # updates every few rounds on a short run


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
                             buffer=8, interval=4, steps=2, rank=4)
    (state,) = store.values()
    C, N = draft[0].config.hidden_size, draft[0].config.vocab_size
    bound = 8 * (4 * C + 2 * N + 12 * 8) + 4 * 4 * (C + N) * 3      # buffer rows + A, B and their two moments
    assert state.size == 8 and state.nbytes == bound
    assert all(d.inputs["buffer"] <= 8 for d in updates(r.trace))
    assert len(updates(r.trace)) >= 2


def test_the_first_two_sampled_tokens_follow_the_targets_joint_distribution():
    """A one-layer draft with a random (non-zero) adapter, verified by the exact rule at T = 1: the first
    two tokens are distributed as the target's joint (chi-square, p-value > 0.001)."""
    V, n, sampler = 24, 1000, Sampler(1.0, top_k=4)
    cfg = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
               max_position_embeddings=128, initializer_range=0.3)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **cfg)).eval()
    small = LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, **cfg)).eval()   # the target's first layer
    small.load_state_dict(model.state_dict(), strict=False)
    lm = LeanLM(model, "target")
    prompt = own_text(lm)
    _, joint = next_two_joint(model, prompt, sampler)
    adapted = OnlineDraft(32, V, 4, 8, 2, "cpu")
    adapted.B = torch.randn(V, 4, generator=torch.Generator().manual_seed(1)) * 0.5
    adapted.version = 1
    key = (*SuffixHistory.key_of(small), 32, V, 4, 8, 2)
    counts, accepted = torch.zeros(V, V, dtype=torch.float64), 0
    for seed in range(n):
        store = OnlineDrafts()
        store.put(key, adapted.copy())
        d = OsdDrafter(small, k=2, rank=4, buffer=8, interval=8, topk=2, history=store)
        new, rounds, _ = decode(lm, d, prompt, 2, sampler, seed=seed, record=None)
        counts[new[0], new[1]] += 1
        accepted += len(rounds[0].accepted)
        assert rounds[0].info["draft_version"] == 1
    assert 0 < accepted < 2 * n                                   # drafts both kept and refused
    exp, obs = (joint / joint.sum() * n).flatten(), counts.flatten()
    assert obs[exp == 0].sum() == 0                               # never a pair the target cannot emit
    keep = exp > 0
    assert chi2_p(obs[keep], exp[keep] / n) > 1e-3


@pytest.mark.parametrize("kw,words", [
    (dict(rank=0), "rank must be an integer >= 1"),
    (dict(interval=2.5), "interval must be an integer >= 1"),
    (dict(lr=0.0), r"lr must be a number in \(0, 1\)"),
    (dict(positions="some"), "positions must be one of rejected, all"),
    (dict(interval=64, buffer=32), r"interval \(64\) must be <= buffer \(32\)"),
    (dict(history=object()), "history must be a speclab OnlineDrafts or SuffixHistory"),
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
