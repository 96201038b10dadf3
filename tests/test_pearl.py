"""PEARL: greedy identical to ar on the toy zoo with the lanes overlapping and one after the other
(same rounds, same decisions), the mode switches its decisions record follow the rule, the two
lanes' recorded forwards overlap in time only when asked to, and at T=1 the first three tokens
follow the target's joint distribution (two random Llamas, chi-square)."""
from __future__ import annotations

import pytest
import torch

import speclab
from sampling_law import pooled_chisquare
from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.drafters.pearl import POST, PRE, PearlDrafter
from speclab.decoding.speculative import decode
from speclab.figures.views import view_of
from speclab.trace import ACCEPTED, NOT_REACHED, REJECTED, Trace, replay

pytestmark = pytest.mark.usefixtures("one_thread")     # a toy's tiny products (conftest)


@pytest.fixture(scope="module")
def greedy_runs(target, draft, heldout_prompts):
    """Per prompt: ar's ids, then pearl with overlap on and off (greedy, 40 tokens)."""
    out = []
    for prompt in heldout_prompts[:2]:
        ref = speclab.generate(target, prompt, "ar", max_new_tokens=40, record=None).ids
        on = speclab.generate(target, prompt, "pearl", draft=draft, max_new_tokens=40, overlap=True)
        off = speclab.generate(target, prompt, "pearl", draft=draft, max_new_tokens=40, overlap=False)
        out.append((ref, on, off))
    return out


def spans_by_step(trace: Trace, lane: str) -> dict[int, list]:
    out = {}
    for s in next(l for l in trace.lanes if l.name == lane).spans:
        out.setdefault(s.step, []).append(s)
    return out


def test_greedy_is_identical_to_ar_with_and_without_overlap(greedy_runs, tmp_path):
    for ref, on, off in greedy_runs:
        assert on.ids == ref and off.ids == ref
        for r in (on, off):
            t = r.trace
            assert replay(t) == ref
            assert t.totals.target_forwards == len(t.rounds)                   # one target forward a round
            assert t.totals.draft_forwards == 5 * len(t.rounds)                # gamma draft forwards a round
            assert t.totals.tau > 1.2 and t.totals.accepted > 0
        # the same schedule: rounds, nodes and decisions equal, only the timing differs
        strip = lambda t: [(r.info, r.path_tokens, r.emitted, [(n.token, n.decision) for n in r.nodes],
                            [(d.inputs, d.output) for d in r.decisions]) for r in t.rounds]
        assert strip(on.trace) == strip(off.trace)
    back = Trace.load(on.trace.save(tmp_path / "pearl.json"))
    assert replay(back) == on.ids and [l.name for l in back.lanes] == ["draft", "target"]
    assert sum(len(l.spans) for l in back.lanes) == back.totals.target_forwards + back.totals.draft_forwards


def test_mode_switches_follow_the_rule_in_the_recorded_decisions(greedy_runs, target, draft, heldout_prompts):
    sampled = speclab.generate(target, heldout_prompts[2], "pearl", draft=draft, max_new_tokens=40,
                               temperature=1.0, seed=1, gamma=3).trace
    for t, gamma in [(on.trace, 5) for _, on, _ in greedy_runs] + [(sampled, 3)]:
        ds = [r.decisions[0] for r in t.rounds]
        assert all(d.policy == "pearl" for d in ds) and ds[0].inputs["mode"] == PRE
        for k, (r, d) in enumerate(zip(t.rounds, ds)):
            v = d.inputs["verdicts"]
            assert v == [n.decision for n in r.nodes]
            tested = 1 if d.inputs["mode"] == PRE else gamma          # PRE: x_1; POST: gamma - 1 carried, then x_1
            assert len(v) == tested == r.drafted and d.inputs["unverified"] == tested - 1
            assert d.inputs["tested"][0] == sum(len(x.path_tokens) + (x.emitted >= 0) for x in t.rounds[:k])
            if REJECTED in v:                                         # any rejection: PRE, both caches back
                i = v.index(REJECTED)
                assert v[:i] == [ACCEPTED] * i and set(v[i + 1:]) <= {NOT_REACHED}
                assert d.output == PRE and r.emitted_kind == "correction"
                assert d.inputs["draft_kv_dropped"] == (tested - 1 - i) + gamma - 1
                assert d.inputs["target_kv_dropped"] == tested - 1 - i
            else:                                                     # first token (PRE) or all (POST) accepted
                assert v == [ACCEPTED] * tested and d.output == POST and r.emitted == -1
                assert d.inputs["rollback"] == d.inputs["target_kv_dropped"] == 0
            assert (d.note != "") == (d.output != d.inputs["mode"])
            if k + 1 < len(t.rounds):
                assert ds[k + 1].inputs["mode"] == d.output == t.rounds[k + 1].info["mode"]
        modes = [r.info["mode"] for r in t.rounds]
        assert PRE in modes and POST in modes
    assert any(REJECTED in r.decisions[0].inputs["verdicts"][:-1] for r in sampled.rounds)   # a carried one


def test_the_lanes_overlap_in_time_only_with_overlap(greedy_runs):
    _, on, off = greedy_runs[0]

    def overlapping(t):
        d, g = spans_by_step(t, "draft"), spans_by_step(t, "target")
        return sum(any(a.start_s < b.end_s and b.start_s < a.end_s for a in d[k] for b in g[k]) for k in g)
    assert overlapping(on.trace) >= len(on.trace.rounds) // 2
    assert overlapping(off.trace) == 0
    kinds = {s.what for s in on.trace.lanes[1].spans}
    assert kinds == {"pre-verify", "post-verify"}
    assert torch.get_num_threads() == 1                 # the caller's count, restored (one_thread's)


def test_the_lanes_and_modes_figure_is_in_the_view(greedy_runs, target, draft):
    from speclab.figures.pearl import pearl_figure
    t = greedy_runs[0][1].trace
    assert "lanes and modes" in [f.name for f in view_of(t).summary]
    fig = pearl_figure(t, 2)
    pre, post, bad = (next(tr for tr in fig.data if tr.name == n)
                      for n in ("PRE-verify round", "POST-verify round", "rejection (rolled back)"))
    modes = [r.info["mode"] for r in t.rounds]
    assert len(pre.base) == modes.count(PRE) and len(post.base) == modes.count(POST)
    assert len(bad.x) == sum(r.emitted_kind == "correction" for r in t.rounds)
    quiet = speclab.generate(target, "def f(x):", "pearl", draft=draft, max_new_tokens=8, record=None).trace
    assert quiet.lanes == [] and pearl_figure(quiet) is None             # record=None: no spans


@pytest.mark.parametrize("kw,words", [(dict(gamma=0), "gamma must be an integer >= 1"),
                                      (dict(overlap="yes"), "overlap must be True")])
def test_bad_parameters_are_one_line_errors(draft, kw, words):
    with pytest.raises(ValueError, match=words) as e:
        PearlDrafter(draft[0], **kw)
    assert "\n" not in str(e.value)


def test_a_rule_other_than_exact_is_refused(target, draft):
    with pytest.raises(ValueError, match="exact rule only"):
        speclab.generate(target, "def f(x):", "pearl", draft=draft, max_new_tokens=4, rule="typical",
                          temperature=1.0)


def test_the_first_three_sampled_tokens_follow_the_targets_joint_distribution():
    """T=1, gamma=2: a PRE test of x_1, then POST tests of the carried x_2 and the next draft token,
    with rejections and roll-backs among them; the first three tokens are distributed as the target's
    joint (chi-square, p-value > 0.001)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from speclab.models.lean.forward import LeanLM
    V, n, sampler = 5, 2000, Sampler(1.0)

    def llama(seed):
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                                            initializer_range=0.3)).eval()
    model, small = llama(0), llama(1)
    prompt = [1, 2, 3]
    with torch.no_grad():
        p = lambda ids: warp(model(torch.tensor([ids])).logits[0, -1], sampler)
        p1 = p(prompt)
        p2 = {a: p(prompt + [a]) for a in range(V)}
        joint = torch.tensor([[[float(p1[a] * p2[a][b] * p(prompt + [a, b])[c]) for c in range(V)] for b in range(V)]
                              for a in range(V)], dtype=torch.float64).flatten()
    lm, drafter = LeanLM(model, "target"), PearlDrafter(small, gamma=2, overlap=False)
    counts, post_rejects = torch.zeros(V ** 3, dtype=torch.float64), 0
    for seed in range(n):
        new, rounds, _ = decode(lm, drafter, prompt, 3, sampler, seed=seed, record=None)
        counts[new[0] * V * V + new[1] * V + new[2]] += 1
        post_rejects += any(r.info["mode"] == POST and r.emitted_kind == "correction" for r in rounds)
    assert 0 < post_rejects < n                                    # carried drafts both kept and refused
    assert pooled_chisquare(joint / joint.sum() * n, counts) > 1e-3
