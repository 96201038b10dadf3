"""Pins the transformers behaviour the adapter relies on: cache crop, 4-D tree masks, early exit."""
import pytest
import torch
from conftest import tiny_llama

from speclab.models.geometry import tree_attention
from speclab.models.hf import CausalLM, early_exit_view

TOL = 1e-4  # fp32 logits: tree forward vs each path alone


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def test_crop_takes_negative_count(tiny):
    lm = CausalLM(tiny)
    lm.forward(torch.arange(10))
    lm.keep(6)
    assert lm.length == 6
    with pytest.raises(ValueError):
        lm.cache.crop(3)  # transformers 5.x refuses a positive length: if this changes, revisit keep()


def test_tree_logits_equal_each_path_alone(tiny):
    prefix = torch.tensor([5, 9, 11, 3])
    #     root -> 0 (20) -> 2 (22) ;  0 -> 3 (23) ; root -> 1 (21) -> 4 (24)
    parents, tokens = [-1, -1, 0, 0, 1], [20, 21, 22, 23, 24]
    lm = CausalLM(tiny)
    lm.forward(prefix[:-1])
    tree_logits = lm.forward(torch.tensor([3] + tokens), parents=parents, n_prefix=1)  # (6, V)
    for leaf, path in {2: [0, 2], 3: [0, 3], 4: [1, 4]}.items():
        alone = CausalLM(tiny)
        ids = torch.cat([prefix, torch.tensor([tokens[i] for i in path])])
        ref = alone.forward(ids)                                           # (len, V)
        for j, node in enumerate(path):
            assert torch.allclose(tree_logits[1 + node], ref[len(prefix) + j], atol=TOL)
        assert torch.allclose(tree_logits[0], ref[len(prefix) - 1], atol=TOL)


def test_keep_positions_leaves_the_accepted_path(tiny):
    prefix = torch.tensor([5, 9, 11, 3])
    lm = CausalLM(tiny)
    lm.forward(prefix[:-1])
    lm.forward(torch.tensor([3, 20, 21, 22, 24]), parents=[-1, -1, 0, 1], n_prefix=1)
    lm.keep_positions(3 + 1, [1, 3])           # path root -> node1 (21) -> node3 (24)
    nxt = lm.forward(torch.tensor([7]))[-1]
    ref = CausalLM(tiny).forward(torch.tensor([5, 9, 11, 3, 21, 24, 7]))[-1]
    assert torch.allclose(nxt, ref, atol=TOL)


def test_tree_mask_shape_and_depths():
    depth, mask = tree_attention([-1, 0, -1], n_prefix=2, past=3, device="cpu")
    assert depth.tolist() == [1, 2, 1]
    assert mask.shape == (1, 1, 5, 8)
    assert mask[0, 0, 3, 3 + 2] == 0 and mask[0, 0, 4, 3 + 2] == float("-inf")  # sibling hidden
    with pytest.raises(ValueError, match="parent"):
        tree_attention([0], 0, 0, "cpu")


def test_early_exit_view_shares_weights_and_matches_truncated_model(tiny):
    view = early_exit_view(tiny, 2)
    assert view.model.layers[0] is tiny.model.layers[0] and len(view.model.layers) == 2
    ids = torch.tensor([[4, 8, 15, 16, 23]])
    with torch.no_grad():
        h = tiny(input_ids=ids, output_hidden_states=True).hidden_states[2]
        ref = tiny.lm_head(tiny.model.norm(h))
        got = view(input_ids=ids).logits
    assert torch.allclose(got, ref, atol=TOL)
    with pytest.raises(ValueError, match="exit layer"):
        early_exit_view(tiny, 4)


def test_early_exit_rejects_unsupported_architecture():
    from transformers import GPT2Config, GPT2LMHeadModel
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="layer-skip needs a Llama-style decoder"):
        early_exit_view(gpt2, 1)


def test_fast_llama_matches_transformers(tiny):
    """The lean forward (fused ops, preallocated cache) gives transformers' logits: prefill, decode,
    trees, early exits and cache edits."""
    from speclab.models.lean.archs import supports
    from speclab.models.lean.forward import LeanLM
    assert supports(tiny)
    hf, fast = CausalLM(tiny), LeanLM(tiny)
    prefix = torch.tensor([5, 9, 11, 3, 40, 41])
    assert torch.allclose(hf.forward(prefix), fast.forward(prefix), atol=TOL)
    parents, tokens = [-1, -1, 0, 0, 1], torch.tensor([20, 21, 22, 23, 24])
    assert torch.allclose(hf.forward(tokens, parents=parents), fast.forward(tokens, parents=parents), atol=TOL)
    hf.keep_positions(6, [1, 4]); fast.keep_positions(6, [1, 4])
    nxt = torch.tensor([7, 8])
    assert torch.allclose(hf.forward(nxt), fast.forward(nxt), atol=TOL)
    hf.keep(7); fast.keep(7)
    ex_hf, ex_fast = hf.exit_lm(2), fast.exit_lm(2)
    assert torch.allclose(ex_hf.forward(torch.tensor([9])), ex_fast.forward(torch.tensor([9])), atol=TOL)
    assert fast.forwards == hf.forwards == 3 and ex_fast.forwards == 1   # exit forwards are not target forwards


def test_fast_backend_greedy_equals_transformers_backend(target, heldout_prompts):
    import speclab
    for p in heldout_prompts[:3]:
        a = speclab.generate(target, p, "ar", max_new_tokens=48, backend="hf").ids
        b = speclab.generate(target, p, "ar", max_new_tokens=48, backend="fast").ids
        assert a == b
