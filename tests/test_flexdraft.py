"""flexdraft (speclab.models.flexdraft, decoding/drafters/flexdraft.py, train/flexdraft.py): the
lean draft forward equals the trainer's forward and its first row is the target's own; greedy
identical to `ar` on the code zoo's target with an adapter whose deltas are large (drafts that are
often wrong); the first two sampled tokens follow the target's joint (chi-square); the length
decision and the trace; wrong inputs; a trainer that runs."""
import json

import pytest
import torch

import speclab
from sampling_law import next_two_joint, pair_counts, pooled_chisquare
from speclab.decoding.acceptance import Sampler
from speclab.decoding.drafters.flexdraft import FlexDraftDrafter
from speclab.models.flexdraft import FlexDraftAdapter, draft_logits, flexdraft_config
from speclab.models.lean.forward import LeanLM
from speclab.trace import Trace, replay

NEW = 32


def adapter_for(model, layers: int = 2, k: int = 4, scale: float = 0.05, seed: int = 0) -> FlexDraftAdapter:
    """An adapter for `model` with every weight drawn at random (B too: the deltas act)."""
    n = model.config.num_hidden_layers
    ad = FlexDraftAdapter(model, flexdraft_config(model.config, n - layers, 4, 8.0, k))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ad.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
        ad.mask_embedding.add_(model.model.embed_tokens.weight.mean(0))
    return ad.to(next(model.parameters()).dtype)


@pytest.fixture(scope="module")
def adapter(target):
    """Random deltas: drafts that are mostly wrong."""
    return adapter_for(target[0])


@pytest.fixture(scope="module")
def trained(target):
    """The toy zoo's adapter for code-target, with the target's tokenizer."""
    from speclab.models import zoo
    return zoo.load("code-flexdraft")[0], target[1]


def test_the_draft_forward_equals_the_training_forward(target, adapter):
    """Rows after 20 committed tokens: the first is the target's own logits at the pending token (no
    mask reaches it), the mask rows equal the trainer's batched forward at that anchor."""
    from speclab.train.flexdraft import flex_train_forward
    model = target[0]
    ids = torch.randint(10, 300, (1, 40), generator=torch.Generator().manual_seed(1))
    a, m = 20, 3
    with torch.no_grad():
        student, teacher = flex_train_forward(model, adapter, ids, torch.tensor([[a, 30]]), m)
        want = model.lm_head(model.model.norm(student[0, 0]))
        full = model(ids).logits[0]
    lm = LeanLM(model)
    lm.forward(ids[0, :a])
    got = draft_logits(lm, adapter, ids[0, a:a + 1], m)
    assert lm.n == a                                    # nothing committed
    assert torch.allclose(got[0], full[a], atol=1e-4)
    assert torch.allclose(got[1:], want, atol=1e-4)
    assert not torch.allclose(got[1:], full[a + 1:a + 1 + m], atol=1e-1)    # the masks guess, they do not see
    assert torch.allclose(model.lm_head(model.model.norm(teacher[0, 0])), full[a + 1:a + 1 + m], atol=1e-4)


@pytest.mark.parametrize("params", [dict(), dict(k=2), dict(theta=0.0), dict(tree=True, width=3)],
                         ids=["defaults", "k2", "whole-block", "tree"])
def test_greedy_identical_to_ar(params, target, adapter, trained, heldout_prompts):
    model, tok = target
    for p in heldout_prompts[:2]:
        ar = speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None)
        noisy = speclab.generate(target, p, "flexdraft", draft=(adapter, tok), max_new_tokens=NEW, **params)
        assert noisy.ids == ar.ids
        r = speclab.generate(target, p, "flexdraft", draft=trained, max_new_tokens=NEW, **params)
        assert r.ids == ar.ids
        rounds = r.trace.rounds
        assert any(len(rd.accepted) > 1 for rd in rounds) or params.get("k") == 2     # a mask row's guess kept
        assert any(rd.drafted > len(rd.accepted) for rd in rounds)                    # and refused


def test_the_trace_records_each_slot_and_the_length(target, adapter, heldout_prompts, tmp_path):
    r = speclab.generate(target, heldout_prompts[0], "flexdraft", draft=(adapter, target[1]), max_new_tokens=16,
                         theta=0.05)
    for rd in r.trace.rounds:
        slots = [d for d in rd.decisions if d.policy == "flexdraft"]
        (length,) = [d for d in rd.decisions if d.policy == "flexdraft-length"]
        assert len(slots) == length.output == len([n for n in rd.nodes if n.source == "flexdraft"])
        assert [d.inputs["from"] for d in slots] == ["target"] + ["mask"] * (len(slots) - 1)
        cum = length.inputs["cumulative"]
        above = sum(c >= 0.05 for c in cum)                    # the running products kept
        assert cum[:above] == [c for c in cum if c >= 0.05] and length.output == max(1, above)
        assert above == len(cum) == 4 or (len(cum) == above + 1 and cum[-1] < 0.05)    # cut at the first below
    back = Trace.load(r.trace.save(tmp_path / "flexdraft.json"))
    assert replay(back) == r.trace.output_ids


def test_the_first_two_sampled_tokens_follow_the_targets_joint_distribution():
    """k = 3 at T = 1: the first round drafts the first token (slot 1, the target's own) and the
    second (a mask row), so the first two tokens' law must be the target's joint."""
    from transformers import LlamaConfig, LlamaForCausalLM
    V, n, sampler = 24, 1500, Sampler(1.0, top_k=4)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                                         initializer_range=0.3)).eval()
    adapter = adapter_for(model, layers=2, k=3, scale=0.05)
    lm = LeanLM(model, "target")
    prompt = [1, 2, 3, 4, 5]
    _, joint = next_two_joint(model, prompt, sampler)
    counts, firsts = pair_counts(lm, lambda: FlexDraftDrafter(model, adapter, k=3, theta=0.0), prompt, sampler, n, V)
    second = sum(len(r.accepted) >= 2 for r in firsts)
    assert 0.05 * n < second < 0.95 * n                      # the mask row's draft kept and refused
    assert pooled_chisquare(joint.flatten() / joint.sum() * n, counts.flatten()) > 1e-3


def test_wrong_inputs_say_what_to_do(target, adapter, draft):
    with pytest.raises(ValueError, match="needs a FlexDraft adapter.*speclab train flexdraft"):
        speclab.generate(target, "def f(x):", "flexdraft", draft=draft)
    with pytest.raises(ValueError, match=r"k must be an integer in 2\.\.4"):
        speclab.generate(target, "def f(x):", "flexdraft", draft=(adapter, target[1]), k=5)
    with pytest.raises(ValueError, match="theta must be"):
        speclab.generate(target, "def f(x):", "flexdraft", draft=(adapter, target[1]), theta=1.5)
    with pytest.raises(ValueError, match="lean forward"):
        speclab.generate(target, "def f(x):", "flexdraft", draft=(adapter, target[1]), backend="hf")


def test_the_trainer_runs_and_saves_a_loadable_adapter(tmp_path):
    """A few seconds on the code zoo's target from its own text: the adapter loads back, drafts,
    and its log names the held-out agreement per slot."""
    from speclab.train.flexdraft import main
    out = tmp_path / "fd"
    assert main(["--target", "code-target", "--data-dirs", "", "--self-text", "12", "--max-new", "48",
                 "--out", str(out), "--minutes", "0.1", "--k", "3", "--layers", "1", "--rank", "2",
                 "--batch", "2", "--groups", "4", "--threads", "1"]) == 0
    info = json.loads((out / "speclab_train.json").read_text())
    assert len(info["held_out"]["acc"]) == 2 and info["command"].startswith("speclab train flexdraft")
    r = speclab.generate("code-target", "def add(a, b):", "flexdraft", draft=str(out), max_new_tokens=8)
    assert r.trace.totals.drafted > 0


def test_every_view_draws_the_block_over_the_verdicts(target, trained, heldout_prompts, tmp_path):
    """The view spec gives flexdraft the block-filling figure (one row: one forward fills the
    block), so the player, the dashboard and the export all draw it; the export holds it."""
    from speclab.export import to_html
    from speclab.figures.dllm_draft import block_fill_figure
    from speclab.figures.views import view_of
    r = speclab.generate(target, heldout_prompts[0], "flexdraft", draft=trained, max_new_tokens=16, theta=0.0)
    t = r.trace
    assert "block filling" in [f.name for f in view_of(t).step]
    fig = block_fill_figure(t, 1)
    slots = [d for d in t.rounds[1].decisions if d.policy == "flexdraft"]
    conf = fig.data[2]
    assert [conf.z[0][d.at] for d in slots] == [d.inputs["confidence"] for d in slots]
    assert "of the target (mask rows)" in fig.layout.title.text
    html = to_html(t, tmp_path / "flexdraft.html").read_text()
    assert "block filling" in html and "of the target (mask rows)" in html
