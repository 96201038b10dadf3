"""The diffusion engine on the real zoo dLLMs: faithful traces, policy rules, quality, bad input."""
import json

import pytest
import torch

import speclab
from speclab.cli import main
from speclab.decoding.dllm_policies import DiffusionPolicy, LocalLeap, Threshold, View, num_transfer
from speclab.models.dllm import Denoiser
from speclab.trace import Trace, TraceError, replay
from speclab.train import digits

ALL = [("dllm-lowconf", {}), ("dllm-lowconf", {"steps": 4, "remasking": "random"}),
       ("dllm-threshold", {"threshold": 0.9}), ("dllm-threshold", {"factor": 1.0}),
       ("dllm-prophet", {"late": 0.5}), ("dllm-sched", {"tau_low": 0.5}), ("dllm-localleap", {}),
       ("dllm-freedave", {"draft_steps": 3})]
CODE_PROMPT = "def read_config(path):\n    with open(path) as f:\n"


@pytest.fixture(scope="module")
def dig():
    return speclab.models.zoo.load_shared("digits-dllm")


@pytest.fixture(scope="module")
def code():
    return speclab.models.zoo.load_shared("code-dllm")


def count_forwards(model):
    """Forwards the network really ran, counted by a hook on the module itself."""
    calls = []
    handle = model.register_forward_hook(lambda *_: calls.append(1))
    return calls, handle


@pytest.mark.parametrize("method,kw", ALL)
@pytest.mark.parametrize("record", ["light", "full"])
def test_faithful_trace(dig, method, kw, record, tmp_path):
    calls, h = count_forwards(dig[0])
    try:
        r = speclab.run(dig, "SUM 31=", method, gen_length=8, record=record, **kw)
    finally:
        h.remove()
    t = r.trace
    assert t.totals.target_forwards == len(calls) == len(t.denoise)
    t.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert replay(back) == r.ids == back.output_ids
    quiet = speclab.run(dig, "SUM 31=", method, gen_length=8, record=None, **kw)
    assert quiet.ids == r.ids and quiet.trace.totals.target_forwards == t.totals.target_forwards


@pytest.mark.parametrize("method,kw", ALL)
def test_commits_stay_in_the_active_block_and_never_repeat(code, method, kw):
    r = speclab.run(code, CODE_PROMPT, method, gen_length=32, block_length=8, record="light", **kw)
    seen = set()
    for s in r.trace.denoise:
        lo, hi = s.block
        assert s.committed, "every step commits at least one position"
        assert set(s.committed) <= set(s.masked) and not seen & set(s.committed)
        if not s.info.get("finish"):
            assert all(lo <= p < hi for p in s.committed)
        seen |= set(s.committed)
    assert replay(r.trace) == r.ids


def test_one_per_step_lowconf_equals_threshold_one(code):
    """With threshold 1.0 nothing passes, so the forced best token alone is committed each step:
    exactly LLaDA's one-token-per-step low-confidence decoding, token for token."""
    a = speclab.run(code, CODE_PROMPT, "dllm-lowconf", gen_length=32, block_length=16, eos_stop=False)
    b = speclab.run(code, CODE_PROMPT, "dllm-threshold", threshold=1.0, gen_length=32, block_length=16,
                    eos_stop=False)
    assert a.ids == b.ids and a.trace.totals.target_forwards == b.trace.totals.target_forwards == 32
    assert all(len(s.committed) == 1 for s in a.trace.denoise)


@pytest.mark.parametrize("block", [8, 32])
def test_freedave_is_lossless_against_one_per_step(code, dig, block):
    """Token for token the one-per-step greedy output, in fewer forwards (each >= 1 token)."""
    from speclab.prompts import load_prompts
    saved = 0
    for p in load_prompts("code-mixed", 6):
        p = p[-300:]
        ref = speclab.run(code, p, "dllm-lowconf", gen_length=32, block_length=block, record=None)
        fd = speclab.run(code, p, "dllm-freedave", gen_length=32, block_length=block, draft_steps=4)
        assert fd.ids == ref.ids and replay(fd.trace) == fd.ids
        assert fd.trace.totals.target_forwards <= ref.trace.totals.target_forwards
        saved += ref.trace.totals.target_forwards - fd.trace.totals.target_forwards
    assert saved > 0
    for p in digits.eval_prompts(10, seed=3):
        ref = speclab.run(dig, p["prompt"], "dllm-lowconf", gen_length=8, record=None)
        assert speclab.run(dig, p["prompt"], "dllm-freedave", gen_length=8, record=None).ids == ref.ids


def test_fixed_steps_commit_the_llada_schedule(code):
    r = speclab.run(code, CODE_PROMPT, "dllm-lowconf", steps=6, gen_length=32, block_length=16, eos_stop=False)
    assert [len(s.committed) for s in r.trace.denoise] == num_transfer(16, 3) * 2 == [6, 5, 5] * 2


def test_threshold_uses_fewer_forwards_on_code(code):
    one = speclab.run(code, CODE_PROMPT, "dllm-lowconf", gen_length=32, eos_stop=False)
    par = speclab.run(code, CODE_PROMPT, "dllm-threshold", threshold=0.5, gen_length=32, eos_stop=False)
    assert par.trace.totals.target_forwards < one.trace.totals.target_forwards == 32


def test_digits_quality(dig):
    """The shipped model makes valid SUM answers and solves held-out ADD (1.000 exact and 0.956
    valid on 500 prompts each, see BENCHMARKS.md), one token per step."""
    prompts = digits.eval_prompts(40, seed=7)
    ok = {"ADD": 0, "SUM": 0}
    for p in prompts:
        r = speclab.run(dig, p["prompt"], "dllm-lowconf", gen_length=8, record=None)
        ok[p["task"]] += digits.check(p["prompt"], dig[1].decode(r.ids))
    assert ok["ADD"] >= 36 and ok["SUM"] >= 34, ok


def test_sampling_is_seeded(dig):
    a = [speclab.run(dig, "SUM 27=", "dllm-lowconf", gen_length=8, temperature=1.0, seed=s).ids for s in range(6)]
    b = [speclab.run(dig, "SUM 27=", "dllm-lowconf", gen_length=8, temperature=1.0, seed=s).ids for s in range(6)]
    assert a == b and len({tuple(x) for x in a}) > 1


def test_eos_stop_ends_early(dig):
    r = speclab.run(dig, "ADD 001+002=", "dllm-lowconf", gen_length=8, block_length=2)
    assert r.ids[-1] == dig[1].eos_token_id and r.trace.totals.target_forwards < 8


def _view(conf, eligible=None):
    conf = torch.tensor(conf)
    el = torch.ones(len(conf), dtype=torch.bool) if eligible is None else torch.tensor(eligible)
    z = torch.zeros(len(conf))
    return View(0, 8, (0, len(conf)), 0, el, el.clone(), torch.arange(len(conf)), conf, z, z, None)


def test_threshold_and_factor_rules():
    v = _view([0.95, 0.5, 0.91, 0.2])
    assert Threshold(0.9).select(v).commit.tolist() == [True, False, True, False]
    assert Threshold(0.99).select(v).commit.tolist() == [True, False, False, False]   # at least one
    # factor f=1: rank j (0-based) needs c >= 1 - 1/(j+2): 0.95 (needs 0.5), 0.91 (0.667), 0.5 (0.75) fails
    assert Threshold(factor=1.0).select(v).commit.tolist() == [True, False, True, False]


def test_threshold_breaks_ties_to_the_leftmost_position():
    """Saturated probabilities tie; the rule must then pick the leftmost, as its docstring says (an
    unstable argsort of 200 equal values picks from the middle)."""
    n = 200
    eligible = [i >= 7 for i in range(n)]
    v = _view([0.5] * n, eligible)
    forced = Threshold(0.99).select(v)                       # none passes: the best one is forced
    assert forced.commit.nonzero().flatten().tolist() == [7] and forced.info["forced"] == [7]
    v = _view([0.9] * n, eligible)
    # factor 0.3: rank 0 needs 0.85, rank 1 needs 0.9, rank 2 needs 0.925: the two leftmost pass
    assert Threshold(factor=0.3).select(v).commit.nonzero().flatten().tolist() == [7, 8]


def test_localleap_relaxes_near_anchors():
    v = _view([0.95, 0.8, 0.1, 0.1, 0.1, 0.1, 0.1, 0.8])
    c = LocalLeap(0.9, 0.75, radius=2).select(v).commit.tolist()
    assert c == [True, True, False, False, False, False, False, False]


def test_replay_rejects_a_double_commit(dig):
    t = speclab.run(dig, "SUM 12=", "dllm-lowconf", gen_length=8).trace
    t.denoise[1].committed = list(t.denoise[0].committed)
    with pytest.raises(TraceError, match="committed while it holds a token"):
        replay(t)


@pytest.mark.parametrize("kw,msg", [
    (dict(gen_length=0), "gen_length must be"),
    (dict(gen_length=8, block_length=3), "must divide gen_length"),
    (dict(gen_length=8, threshold=0.0), r"threshold must be in \(0, 1\]"),
    (dict(gen_length=8, threshold=1.5), r"threshold must be in \(0, 1\]"),
    (dict(gen_length=8, bogus=1), "does not take"),
])
def test_bad_input(dig, kw, msg):
    with pytest.raises(ValueError, match=msg):
        speclab.run(dig, "SUM 12=", "dllm-threshold", **kw)


def test_freedave_refuses_sampling_and_bad_draft_steps(dig):
    with pytest.raises(ValueError, match="GREEDY"):
        speclab.run(dig, "SUM 12=", "dllm-freedave", gen_length=8, temperature=1.0)
    with pytest.raises(ValueError, match="draft_steps must be"):
        speclab.run(dig, "SUM 12=", "dllm-freedave", gen_length=8, draft_steps=0)
    with pytest.raises(ValueError, match="branch_tokens must be"):
        speclab.run(dig, "SUM 12=", "dllm-freedave", gen_length=8, branch_tokens=0)


def test_draft_tree_keeps_the_likeliest_paths_and_one_by_one_is_the_chain():
    from speclab.decoding.freedave import draft_tree
    # 3 eligible slots in confidence order 5, 2, 7; vocabulary of 4
    p = torch.tensor([[0.9, 0.1, 0.0, 0.0],        # slot 5: token 0 (sure)
                      [0.0, 0.6, 0.4, 0.0],        # slot 2: token 1, then 2
                      [0.0, 0.2, 0.3, 0.5]])       # slot 7: token 3, then 2
    rows, order, first = p.clamp_min(1e-9).log(), torch.tensor([5, 2, 7]), torch.tensor([0, 1, 3])
    chain = draft_tree(rows, first, order, 4, 1, 1)
    assert chain == [(-1, 5, 0), (0, 2, 1), (1, 7, 3)]          # the top-(k+1) fills, as the paper's chain
    tree = draft_tree(rows, first, order, 4, 2, 2)
    # node 0 is sure; children of 0: slot 2 tok 1 (0.6), slot 2 tok 2 (0.4), slot 7 tok 3 (0.5 x 0.5),
    # slot 7 tok 2 (0.1 x 0.5); the 3 likeliest paths below the root: (2,1) 0.6, (2,2) 0.4, then
    # (2,1)->(7,3) 0.6 x 0.5 = 0.30 beats (7,3) 0.25
    assert tree == [(-1, 5, 0), (0, 2, 1), (0, 2, 2), (1, 7, 3)]
    assert draft_tree(rows, first, order, 1, 2, 2) == [(-1, 5, 0)]


def test_freedave_tree_and_chain_are_lossless_and_record_their_trees(code):
    """Both shapes give the one-per-step output; every step's commits are the recorded tree's path
    to the accepted node, in order, and the committed tokens are what the canvas holds after it."""
    from speclab.prompts import load_prompts
    for p in load_prompts("code-mixed", 3):
        p = p[-300:]
        ref = speclab.run(code, p, "dllm-lowconf", gen_length=32, block_length=8, record=None)
        for kw in ({"branch_slots": 1, "branch_tokens": 1}, {"draft_steps": 6}):
            fd = speclab.run(code, p, "dllm-freedave", gen_length=32, block_length=8, **kw)
            assert fd.ids == ref.ids and replay(fd.trace) == fd.ids
            for st in fd.trace.denoise:
                tree, k, path = st.info["tree"], st.info["accepted_node"], []
                while k >= 0:
                    path.append(tree[k][1])
                    k = tree[k][0]
                assert path[::-1] == st.info["order"] and sorted(path) == st.committed
                assert st.committed_tokens == [st.tokens[q] for q in st.committed]
                if kw.get("branch_slots") == 1:
                    assert all(node[0] == i - 1 for i, node in enumerate(tree))     # a chain
            from speclab.figures.detail import denoise_html
            shown = denoise_html(fd.trace, 0)
            assert f"draft tree ({len(fd.trace.denoise[0].info['tree'])} canvases" in shown and "&#10003;" in shown


def test_steps_must_fit_the_blocks(dig):
    with pytest.raises(ValueError, match="multiple of the number of blocks"):
        speclab.run(dig, "SUM 12=", "dllm-lowconf", gen_length=8, block_length=2, steps=6)


def test_causal_lm_is_refused():
    with pytest.raises(ValueError, match="not a masked-diffusion LM"):
        speclab.run("code-draft", "def ", "dllm-threshold", gen_length=8)
    with pytest.raises(ValueError, match="not a masked-diffusion LM"):
        Denoiser(speclab.models.zoo.load_shared("code-target")[0])


def test_cli_json_and_errors(capsys):
    code = main(["run", "--target", "digits-dllm", "--method", "dllm-threshold", "--threshold", "0.9",
                 "--gen-length", "8", "--block-length", "8", "--prompt", "ADD 120+305=", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and {"text", "ids", "new_tokens", "target_forwards", "wall_s"} <= set(d)
    assert d["target_forwards"] <= 8 and d["new_tokens"] == len(d["ids"])
    code = main(["run", "--target", "digits-dllm", "--method", "dllm-threshold", "--gen-length", "8",
                 "--block-length", "3", "--prompt", "ADD 1+2="])
    err = capsys.readouterr().err
    assert code == 2 and "must divide gen_length" in err and "Traceback" not in err


def test_every_policy_is_registered():
    """Every policy class of the four policy files is one diffusion row's config, with a step loop."""
    import inspect

    from speclab.decoding import dllm_adapt, dllm_policies, dllm_revise, dparallel
    from speclab.decoding.registry import METHODS, method_params
    rows = {m.config: m for m in METHODS.values() if m.family == "diffusion"}
    classes = {c for mod in (dllm_policies, dllm_adapt, dllm_revise, dparallel)
               for _, c in inspect.getmembers(mod, inspect.isclass)
               if DiffusionPolicy in c.__mro__[1:] and not c.__name__.startswith("_")}
    assert classes == set(rows) and len(rows) == 14
    for cls, m in rows.items():
        assert m.engine == "diffusion" and m.loop is not None and "gen_length" in method_params(m.name)
    assert METHODS["dllm-freedave"].loop is not METHODS["dllm-threshold"].loop


def test_dllm_is_refused_by_causal_methods(dig):
    with pytest.raises(ValueError, match="masked-diffusion LM"):
        speclab.generate(dig, "ADD 001+002=", "ar", max_new_tokens=4)


def test_the_mask_token_is_never_proposed(dig):
    """A model that prefers <|mask|> everywhere must still finish (it would loop forever)."""
    model, tok = dig
    mask_id = tok.mask_token_id
    h = model.lm_head.register_forward_hook(lambda m, i, out: out.index_fill(-1, torch.tensor([mask_id]), 1e4))
    try:
        for method in ("dllm-lowconf", "dllm-threshold", "dllm-freedave"):
            r = speclab.run(dig, "ADD 388+603=", method, gen_length=8)
            assert mask_id not in r.ids and r.trace.totals.target_forwards <= 8
    finally:
        h.remove()


def test_frontier_table_reads_the_active_blocks_masked_slots_in_order(code):
    from speclab.bench.dllm_eval import frontier_table
    traces = [speclab.run(code, CODE_PROMPT, "dllm-lowconf", gen_length=16, block_length=8,
                          eos_stop=False).trace]
    steps = traces[0].denoise
    rows = [r.split("|")[1:-1] for r in frontier_table(traces, depth=3).splitlines() if r.startswith("| ")][1:]
    # every step has a frontier slot; the d-th slot exists on the steps with >= d masked in the block
    want = [sum(len([p for p in s.masked if s.block[0] <= p < s.block[1]]) >= d for s in steps) for d in (1, 2, 3)]
    assert [int(r[1]) for r in rows] == want and want[0] == len(steps) == 16
    frontier = [next(c for p, c in zip(s.masked, s.conf) if p >= s.block[0]) for s in steps]
    assert float(rows[0][2]) == pytest.approx(sum(frontier) / len(frontier), abs=1e-3)
    assert all(0 <= float(r[3]) <= float(r[4]) <= 1 for r in rows)        # p >= 0.9 is within p >= 0.7
