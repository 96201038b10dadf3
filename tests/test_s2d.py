"""S2D (decoding/drafters/s2d.py, train/s2d.py) on the toy zoo: one sorted draft `code-s2d` serving
two targets of different sizes (code-target, code-target-s), each identical to its own ar; the
depth rule and its record, the record's per-depth hits against the sub-drafts run by hand; a wrong
depth; and the trainer for a few steps."""
import pytest
import torch

import speclab
from speclab.decoding.drafters.s2d import choose_depth
from speclab.models import zoo
from speclab.records import SubDraft
from speclab.train.ar import ExitCapture

PROMPT = "def parse_args(argv):\n    parser = argparse.ArgumentParser("


@pytest.fixture(scope="module")
def s2d():
    return zoo.load("code-s2d", device="cpu")


@pytest.fixture(scope="module")
def small():
    return zoo.load("code-target-s", device="cpu")


def test_choose_depth_takes_the_shallowest_at_the_threshold_else_the_best():
    assert choose_depth([1, 2, 3, 4], [0.5, 0.72, 0.8, 0.9], 0.7) == 2
    assert choose_depth([1, 2, 3, 4], [0.71, 0.72, 0.8, 0.9], 0.7) == 1
    assert choose_depth([1, 2, 3, 4], [0.3, 0.6, 0.5, 0.6], 0.7) == 4      # none passes: best, ties deeper
    assert choose_depth([2, 4], [0.65, 0.4], 0.7) == 2


def sub_draft_hits(draft, ids: list[int], n_prompt: int, scored: int, depths: list[int]) -> list[int]:
    """Per depth, how many of the first `scored` new tokens the sub-draft's greedy token matches, from
    transformers' own forward of the draft over the whole text (hidden state after each depth)."""
    model = draft[0]
    cap = ExitCapture(model, depths)
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
        rows = slice(n_prompt - 1, n_prompt - 1 + scored)
        want = torch.tensor(ids[n_prompt:n_prompt + scored])
        out = [int((model.lm_head(model.model.norm(cap.out[d][0, rows])).argmax(-1) == want).sum()) for d in depths]
    for h in cap.handles:
        h.remove()
    return out


@pytest.mark.parametrize("name", ["code-target", "code-target-s"])
def test_one_sorted_draft_serves_two_targets_each_identical_to_its_ar(name, small, s2d):
    """The same sorted draft drafts for both targets; each decodes to its own ar; the depth chosen each
    round is the rule's on the record's alpha, and the record's hits per depth are the sub-drafts'."""
    target = small if name == "code-target-s" else zoo.load("code-target", device="cpu")
    ref = speclab.generate(target, PROMPT, "ar", max_new_tokens=32, record=None).ids
    r = speclab.generate(target, PROMPT, "s2d", draft=s2d, max_new_tokens=32, record="light")
    assert r.ids == ref and r.trace.totals.accepted > 0
    depths = s2d[0].config.speclab_sorted_depths
    for rnd in r.trace.rounds:
        rec, (d,) = SubDraft.of(rnd), [d for d in rnd.decisions if d.policy == "s2d-depth"]
        alpha = [(h + 1) / (rec.s2d_scored + 2) for h in rec.s2d_hits]
        assert d.inputs["alpha"] == [round(a, 4) for a in alpha] and d.threshold == 0.7
        assert rec.s2d_depth == d.output == choose_depth(depths, alpha, 0.7)
        assert all(n.source == f"s2d{rec.s2d_depth}" for n in rnd.nodes)
    last = SubDraft.of(r.trace.rounds[-1])
    n_prompt = len(r.trace.prompt_ids)
    assert last.s2d_scored == sum(len(rd.accepted) + 1 for rd in r.trace.rounds[:-1])    # committed before it
    assert last.s2d_hits == sub_draft_hits(s2d, list(r.trace.prompt_ids) + list(r.trace.output_ids), n_prompt,
                                           last.s2d_scored, depths)
    if name == "code-target-s":             # a fixed sub-draft, recording off
        fixed = speclab.generate(target, PROMPT, "s2d", draft=s2d, max_new_tokens=32, record=None, depth=depths[0])
        assert fixed.ids == ref


def test_a_depth_the_draft_does_not_have_is_refused(s2d):
    with pytest.raises(ValueError, match="sorted depths"):
        speclab.generate("code-target", PROMPT, "s2d", draft=s2d, max_new_tokens=4, depth=7)


def test_the_trainer_runs_and_its_sorted_draft_drafts(tmp_path):
    """`speclab train s2d` for two steps on a slice: each depth's held-out numbers recorded, the
    depths in the config, and the saved draft drafts for code-target identically to ar."""
    import json

    from pathlib import Path

    from speclab.train import s2d as ts
    from speclab.train.corpus import is_held_out
    src = Path(ts.__file__).read_text()                      # a small corpus: two modules, one held out
    names = [f"m{i}" for i in range(40)]
    for name in (next(n for n in names if is_held_out(n)), next(n for n in names if not is_held_out(n))):
        (tmp_path / "corpus").mkdir(exist_ok=True)
        (tmp_path / "corpus" / f"{name}.py").write_text(src)
    out = tmp_path / "s2d"
    assert ts.main(["--out", str(out), "--max-steps", "2", "--corpus-root", str(tmp_path / "corpus"),
                    "--held-windows", "1", "--batch", "1",
                    "--seq-len", "32", "--depths", "2,4", "--eval-targets", "code-target", "--threads", "1"]) == 0
    rec = json.loads((out / "speclab_train.json").read_text())
    assert rec["depths"] == [2, 4] and set(rec["held_out"]["code-target"]) == {"2", "4"}
    assert [e["step"] for e in rec["curve"]] == [0, 2]
    draft = zoo.load(str(out), device="cpu")
    assert draft[0].config.speclab_sorted_depths == [2, 4]
    ref = speclab.generate("code-target", "def f(x):", "ar", max_new_tokens=12, record=None).ids
    assert speclab.generate("code-target", "def f(x):", "s2d", draft=draft, max_new_tokens=12).ids == ref


def test_the_first_two_sampled_tokens_follow_the_targets_joint_distribution():
    """k = 2 at T = 1 on tiny random models, drafting from sub-draft depth 1 of 3: the first token's q
    is read from the pending forward's exit at that depth, its next from the sub-draft's own step,
    so the first two tokens' law must be the target's joint (the sub-draft's tokens both kept and
    refused)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from sampling_law import next_two_joint, pooled_chisquare
    from speclab.decoding.acceptance import Sampler
    from speclab.decoding.drafters.s2d import S2DDrafter
    from speclab.decoding.speculative import decode
    from speclab.models.lean.forward import LeanLM
    V, n, sampler = 24, 1200, Sampler(1.0)
    torch.manual_seed(0)
    cfg = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
               max_position_embeddings=128, initializer_range=0.3)
    target = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, **cfg)).eval()
    draft = LlamaForCausalLM(LlamaConfig(num_hidden_layers=3, **cfg)).eval()
    draft.config.speclab_sorted_depths = [1, 2, 3]
    lm, prompt = LeanLM(target, "target"), [1, 2, 3, 4, 5]
    _, joint = next_two_joint(target, prompt, sampler)
    counts, kept = torch.zeros(V, V, dtype=torch.float64), 0
    drafter = S2DDrafter(draft, depth=1, k=2)
    for seed in range(n):
        lm.reset()
        new, rounds, _ = decode(lm, drafter, prompt, 2, sampler, seed=seed, record=None)
        counts[new[0], new[1]] += 1
        kept += len(rounds[0].accepted) >= 1
        if seed < 20:                           # recording changes nothing drawn
            assert decode(lm, drafter, prompt, 2, sampler, seed=seed, record="light")[0] == new
    assert 0.05 * n < kept < 0.95 * n
    assert pooled_chisquare(joint.flatten() / joint.sum() * n, counts.flatten()) > 1e-3
