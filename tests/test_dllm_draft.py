"""dllm-draft: a block-diffusion LM drafts a block, the target verifies it. Lossless (greedy identical
to ar on the toy zoo, chain and tree; the joint of two sampled tokens at T = 1 on a random toy, with
q carried and with point masses), the dLLM's cache in step with the committed text (a run's every
block equals one drafted from scratch), one decision per slot, the figure's data and the cost."""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import speclab
from speclab import metrics
from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.dllm_policies import num_transfer
from speclab.decoding.drafters.dllm import DllmDrafter
from speclab.decoding.speculative import Context, decode
from speclab.figures.dllm_draft import block_cost, block_fill_figure
from speclab.figures.views import view_of
from speclab.models.dllm import mark_dllm
from speclab.models.lean.forward import LeanLM
from speclab.models.zoo import load
from speclab.trace import Trace, replay

from sampling_law import pair_counts  # tests/ is on the path, as for conftest
from test_rules import chi2_p

pytestmark = pytest.mark.usefixtures("one_thread")     # a toy's tiny products (conftest)
NEW = 40


@pytest.fixture(scope="module")
def dllm():
    """code-dllm read block-causally: committed text causal and cached, the block bidirectional.
    A weak drafter that way (it was trained whole-canvas), which losslessness does not need."""
    model, tok = load("code-dllm", device="cpu")
    model.config.speclab_block_causal = True
    return model, tok


@pytest.fixture(scope="module")
def lm(target):
    return LeanLM(target[0], "target")


def started(draft, ids, sampler=Sampler(0.0), seed=0, **kw) -> DllmDrafter:
    d = DllmDrafter(draft, **kw)
    d.begin(Context(list(ids), len(ids), len(ids), torch.device("cpu")), None, sampler,
            torch.Generator().manual_seed(seed), "light")
    return d


def ctx(ids):
    return Context(list(ids), len(ids), 1, torch.device("cpu"))


@pytest.fixture(scope="module")
def refs(target, heldout_prompts):
    return [speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None).ids for p in heldout_prompts[:2]]


@pytest.mark.parametrize("kw", [dict(), dict(k=4, steps=2, order="left"), dict(k=3, steps=3, tree=True, width=3)])
def test_greedy_is_identical_to_ar_on_the_toy_zoo(target, dllm, heldout_prompts, refs, kw, tmp_path):
    n = 2 if not kw else 1              # the default on two prompts, the variants on one
    for prompt, ref in zip(heldout_prompts[:n], refs):
        r = speclab.generate(target, prompt, "dllm-draft", draft=dllm, max_new_tokens=NEW, **kw)
        assert r.ids == ref, f"dllm-draft {kw} diverged from greedy ar on {prompt[:40]!r}"
    t = r.trace
    k, steps = kw.get("k", 4), kw.get("steps", 1)
    assert t.totals.accepted > 0 and t.totals.draft_forwards == steps * len(t.rounds)   # what ran, counted
    for rd in t.rounds:
        ds = [d for d in rd.decisions if d.policy == "dllm-draft"]
        # one decision per slot, naming the chain's token there and the forward that set it
        assert [d.at for d in ds] == list(range(k)) and [d.output for d in ds] == rd_tokens(rd)[:k]
        per_step = [sum(d.inputs["step"] == s + 1 for d in ds) for s in range(steps)]
        assert per_step == num_transfer(k, steps) and all(0 < d.inputs["confidence"] <= 1 for d in ds)
        assert rd.drafted == (k if not kw.get("tree") else rd.drafted) and rd.drafted >= k
    if kw.get("tree"):
        assert any(n.source == "candidate" for rd in t.rounds for n in rd.nodes)
    back = Trace.load(t.save(tmp_path / "dllm-draft.json"))
    assert replay(back) == t.output_ids
    assert [rd.decisions for rd in back.rounds] == [rd.decisions for rd in t.rounds]


def rd_tokens(rd) -> list[int]:
    """The chain's tokens of a recorded round: nodes 0..k-1 are the slots, in order."""
    return [n.token for n in rd.nodes if n.source != "candidate"]


@pytest.mark.parametrize("kw", [dict(k=4, steps=1), dict(k=4, steps=3)])
def test_every_block_of_a_run_equals_one_drafted_from_scratch(lm, dllm, heldout_prompts, target, kw):
    """The dLLM's cache holds exactly the committed text: each round's block (tokens, confidences)
    is what a fresh drafter, caching the same text in one go, drafts there."""
    tok = target[1]
    prompt = tok(heldout_prompts[2])["input_ids"]
    d = DllmDrafter(dllm[0], **kw)
    new, rounds, _ = decode(lm, d, prompt, NEW, Sampler(0.0), record="light")
    ids = list(prompt)
    for rd in rounds[:8]:
        fresh = started(dllm[0], ids, **kw).propose(ctx(ids))
        assert fresh.tokens == rd_tokens(rd)
        got = [d.inputs["confidence"] for d in rd.decisions]
        assert [dd.inputs["confidence"] for dd in fresh.decisions] == pytest.approx(got, abs=1e-4)
        ids += rd.path_tokens + [rd.emitted]


def tiny_pair(V=24, seed=0):
    """A random target and a block-diffusion drafter of its shape: the target's weights plus noise
    (so it is often right, not always)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3)
    target = LlamaForCausalLM(cfg).eval()
    draft = copy.deepcopy(target)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return target, draft


@pytest.mark.parametrize("kw", [dict(k=2, steps=1), dict(k=2, steps=2)])
def test_the_first_two_sampled_tokens_follow_the_targets_joint(kw):
    """T = 1, top-k 4: the first two tokens are distributed as the target's joint (chi-square,
    p > 0.001). steps=1 drafts every slot with its q (speculative sampling); steps=2, confidence
    order, sends both slots as point masses when the second was set first (module docstring)."""
    V, n, s = 24, 400, Sampler(1.0, top_k=4)
    model, draft = tiny_pair(V)
    prompt = [3, 7, 1, 9]
    with torch.no_grad():
        p = lambda ids: warp(model(input_ids=torch.tensor([ids])).logits[0, -1], s)   # noqa: E731
        first = p(prompt)
        joint = torch.stack([first[a] * p(prompt + [a]) for a in range(V)])         # (V, V)
    mask = int(first.argmin())                     # the mask: a token the target never commits first
    mark_dllm(draft.config, mask, shift=True)
    draft.config.speclab_block_causal = True
    counts, firsts = pair_counts(LeanLM(model, "target"), lambda: DllmDrafter(draft, **kw), prompt, s, n, V)
    accepted = sum(len(r.accepted) for r in firsts)
    assert 0 < accepted < n * kw["k"]                             # drafts both kept and refused
    possible = joint > 0                    # top-k 4 twice: 16 cells, none rare enough to pool
    assert counts[~possible].sum() == 0
    assert chi2_p(counts[possible], joint[possible]) > 1e-3


def test_under_sampling_only_slots_set_in_order_carry_q():
    model, draft = tiny_pair()
    mark_dllm(draft.config, 0, shift=True)
    draft.config.speclab_block_causal = True
    ids = [3, 7, 1, 9]
    for seed in range(20):
        tree = started(draft, ids, Sampler(1.0), seed, k=4, steps=4).propose(ctx(ids))
        at = [d.inputs["step"] for d in tree.decisions]
        in_order = [all(at[j] <= at[i] for j in range(i)) and all(at[j] >= at[i] for j in range(i, 4)) for i in range(4)]
        assert [i - 1 in tree.q_map() for i in range(4)] == in_order
        assert sorted(at) == [1, 2, 3, 4]
    left = started(draft, ids, Sampler(1.0), 0, k=4, steps=4, order="left").propose(ctx(ids))
    assert [d.inputs["step"] for d in left.decisions] == [1, 2, 3, 4] and sorted(left.q_map()) == [-1, 0, 1, 2]


def test_the_figure_shows_each_slot_where_it_was_set_over_the_verdicts(target, dllm, heldout_prompts):
    r = speclab.generate(target, heldout_prompts[0], "dllm-draft", draft=dllm, max_new_tokens=24, k=4, steps=2)
    t = r.trace
    assert "block filling" in [f.name for f in view_of(t).step]
    rd = t.rounds[1]
    fig = block_fill_figure(t, 1)
    verdict, earlier, conf, _ = fig.data[:4]
    for d in rd.decisions:
        s = d.inputs["step"] - 1
        assert conf.z[s][d.at] == d.inputs["confidence"]
        assert [row[d.at] for row in earlier.z] == [1 if j > s else None for j in range(2)]
    want = [next(n.decision for n in rd.nodes if n.id == i) for i in range(4)]
    assert list(verdict.marker.color) == [{"accepted": "#2ca02c", "rejected": "#d62728", "not_reached": "#bbbbbb"}[w]
                                          for w in want]
    m = block_cost(t)
    assert f"breaks even at tau {m['break_even_tau']:.2f}" in fig.layout.title.text


def test_the_round_cost_and_the_tau_it_breaks_even_at(target, dllm, heldout_prompts):
    t = speclab.generate(target, heldout_prompts[0], "dllm-draft", draft=dllm, max_new_tokens=24, record=None).trace
    rs = t.rounds[1:]
    round_s = sum(r.draft_s + r.verify_s for r in rs) / len(rs)
    m = block_cost(t, ar_step_s=round_s / 2.5)
    assert m["c"] == pytest.approx(2.5) and m["break_even_tau"] == m["c"] and m["unit"] == "ar step"
    assert m["break_even_alpha"] == pytest.approx(metrics.break_even(4, 2.5))
    assert metrics.expected_tau(m["break_even_alpha"], 4) == pytest.approx(2.5, abs=1e-6)   # tau there is c
    own = block_cost(t)                 # the verify forward as the unit: c >= 1 (the verify itself)
    assert own["unit"] == "verify forward" and own["c"] > 1 and own["c_draft"] > 0


@pytest.mark.parametrize("kw,words", [
    (dict(k=0), "k must be an integer >= 1"),
    (dict(k=4, steps=5), "steps must be an integer in 1..k=4"),
    (dict(order="random"), "order must be one of confidence, left"),
    (dict(width=0), "width must be an integer >= 1"),
])
def test_bad_parameters_are_one_line_errors(dllm, kw, words):
    with pytest.raises(ValueError, match=words) as e:
        DllmDrafter(dllm[0], **kw)
    assert "\n" not in str(e.value)


def test_a_causal_draft_or_none_is_refused_in_one_line(target):
    with pytest.raises(ValueError, match="is not one: use draft-model") as e:
        speclab.generate(target, "def f(x):", "dllm-draft", draft="code-draft", max_new_tokens=4)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="needs a block-diffusion LM for this target"):
        speclab.generate("code-target", "def f(x):", "dllm-draft", max_new_tokens=4)
