"""causal-tree (decoding/drafters/causal_tree.py, train/causal_tree.py): a tree drafted in one
forward equals each of its branches drafted alone (tree-causal rows); the per-slot and per-branch
records; the first two sampled tokens follow the target's joint; a trainer that runs. Greedy
identity to `ar` is the registry-wide test's (tests/test_engine.py)."""
import json

import torch

import speclab
from sampling_law import next_two_joint, pair_counts, pooled_chisquare
from speclab.decoding.acceptance import Sampler
from speclab.decoding.drafters.causal_tree import CausalTreeDrafter
from speclab.models.causal_tree import CausalTreeAdapter, branch_rows, causal_tree_config, tree_logits, tree_shape
from speclab.decoding.speculative import decode
from speclab.models.lean.forward import LeanLM
from speclab.trace import Trace, replay


def tiny(V=24, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                                        initializer_range=0.3)).eval()


def random_adapter(model, k=4, width=3, scale=0.05):
    ad = CausalTreeAdapter(model, causal_tree_config(model.config, 1, 4, 8.0, k, width))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in ad.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
        ad.rank_embedding.mul_(20)                          # ranks that matter
    return ad


def test_a_tree_from_one_forward_equals_each_branch_drafted_alone():
    """Every row of the full tree's ONE forward equals that row drafted with its own branch only
    (a causal chain of its ancestors), and rows of different ranks at one slot differ."""
    model = tiny()
    ad = random_adapter(model)
    lm = LeanLM(model, "target")
    lm.forward(torch.tensor([1, 2, 3, 4]))
    clean = torch.tensor([5, 6])
    parents, ranks, _ = tree_shape(4, 3)
    full = tree_logits(lm, ad, clean, parents, ranks)
    assert lm.n == 4                                                    # nothing committed
    for row in range(len(parents)):
        br = branch_rows(parents, row)
        alone = tree_logits(lm, ad, clean, [i - 1 for i in range(len(br))], [ranks[j] for j in br])
        assert torch.allclose(alone[0], full[0], atol=1e-5)             # the target's own row
        assert torch.allclose(alone[-1], full[1 + row], atol=1e-4), f"row {row} (branch {br})"
    side = [j for j in range(len(parents)) if ranks[j] > 0 and parents[j] == parents[1]]
    assert side and not torch.allclose(full[2], full[1 + side[0]], atol=1e-3)
    ids = [1, 2, 3]                                         # and these mostly wrong trees decode as ar does
    with torch.no_grad():
        for _ in range(16):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    ar = ids[3:]
    greedy = Sampler(0.0)
    got, rounds, _ = decode(lm, CausalTreeDrafter(model, ad), [1, 2, 3], 16, greedy, record=None)
    assert got == ar and any(rd.drafted > len(rd.accepted) for rd in rounds)


def test_the_trace_records_each_slot_and_each_branch(tmp_path):
    r = speclab.generate("code-target", "def add(a, b):\n    return", "causal-tree", max_new_tokens=24)
    ar = speclab.generate("code-target", "def add(a, b):\n    return", "ar", max_new_tokens=24, record=None)
    assert r.ids == ar.ids
    w = 2
    for rd in r.trace.rounds[1:]:
        main = [d for d in rd.decisions if d.policy == "causal-tree"]
        side = [d for d in rd.decisions if d.policy == "causal-tree-branch"]
        assert [d.at for d in main] == list(range(len(main))) and len(side) == (len(main) - 2) * (w - 1)
        for d in main:
            assert d.inputs["candidates"][0] == d.output and d.inputs["probs"][0] == d.inputs["confidence"]
        for d in side:                                  # a side token: never the main token at its slot
            assert d.output != main[d.at].output and d.output in d.inputs["candidates"]
            assert d.inputs["next"] is not None
        assert sum(n.source == "branch" for n in rd.nodes) == 2 * len(side)
    back = Trace.load(r.trace.save(tmp_path / "causal-tree.json"))
    assert replay(back) == r.trace.output_ids
    from speclab.figures.views import view_of
    assert "block filling" in [f.name for f in view_of(r.trace).step]


def test_the_first_two_sampled_tokens_follow_the_targets_joint_distribution():
    """k = 3, width 2 at T = 1: the first round's tree holds the first two tokens (slot 1 and a
    mask row's slot 2 with a side branch), so their law must be the target's joint."""
    V, n, sampler = 24, 300, Sampler(1.0, top_k=4)
    model = tiny()
    ad = random_adapter(model, k=3, width=2)
    lm = LeanLM(model, "target")
    prompt = [1, 2, 3, 4, 5]
    _, joint = next_two_joint(model, prompt, sampler)
    counts, firsts = pair_counts(lm, lambda: CausalTreeDrafter(model, ad, k=3, width=2), prompt, sampler, n, V)
    second = sum(len(r.accepted) >= 2 for r in firsts)
    assert 0.05 * n < second < 0.95 * n
    assert pooled_chisquare(joint.flatten() / joint.sum() * n, counts.flatten()) > 1e-3


def test_the_trainer_runs_and_saves_a_loadable_adapter(tmp_path):
    from speclab.train.causal_tree import main
    out = tmp_path / "ct"
    assert main(["--target", "code-target", "--data-dirs", "", "--self-text", "12", "--max-new", "48",
                 "--out", str(out), "--max-steps", "2", "--k", "3", "--width", "2", "--layers", "1", "--rank", "2",
                 "--batch", "2", "--groups", "2", "--threads", "1"]) == 0
    info = json.loads((out / "speclab_train.json").read_text())
    assert len(info["held_out"]["acc"]) == 2 and "acc_branch" in info["held_out"]
    assert info["command"].startswith("speclab train causal-tree")
    r = speclab.generate("code-target", "def add(a, b):", "causal-tree", draft=str(out), max_new_tokens=8)
    assert r.trace.totals.drafted > 0
