"""The hub architectures on the lean forward: Qwen2 / Qwen2.5 (biases on q, k, v), Qwen3 (an RMSNorm
on each head of q and k), Mistral (a sliding window), Gemma (scaled embeddings, RMSNorm by
1 + weight, a GELU-tanh gate, tied head) and a Llama with every bias (attention_bias, mlp_bias),
each a transformers model built from a tiny config with random weights (biases and norm weights drawn too: transformers starts them at 0
and 1, where a forward that skipped them would still agree). The lean forward must give transformers'
own logits to fp32 rounding in every step a decode takes (prefill, one-row decode, chain verify,
tree verify, rollback, a kept tree path), and every speculative method must decode exactly what
`ar` decodes. Drafts share the target's vocabulary: a one-layer model of the same family, the
target itself (every draft accepted), and EAGLE / Medusa heads with random weights. Gemma 2 / 3
stay on transformers' forward, and decode there."""
import pytest
import torch
import torch.nn.functional as F
from transformers import (Gemma2Config, Gemma2ForCausalLM, Gemma3TextConfig, Gemma3ForCausalLM, GemmaConfig,
                          GemmaForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

import speclab
from speclab.decoding.registry import get_method, methods
from speclab.models import kernels
from speclab.models.backends import make_lm, resolve
from speclab.models.hf import CausalLM
from speclab.models.lean.archs import arch_of, supports, why_not
from speclab.models.lean.forward import LeanLM

TOL = 1e-4          # fp32 logits of the lean forward against transformers' (the Llama tests' bound)
NEW = 16

FAMILIES = {
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen2-tied": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=True)),     # Qwen2.5-0.5B's head
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=32)),                         # head_dim != C / H
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=None)),           # Mistral v0.2+
    "llama-bias": (LlamaConfig, LlamaForCausalLM, dict(attention_bias=True, mlp_bias=True)),   # every bias
    "gemma": (GemmaConfig, GemmaForCausalLM, dict(head_dim=32)),        # Gemma 1 / CodeGemma: tied, GELU-tanh
    "gemma2": (Gemma2Config, Gemma2ForCausalLM, dict(head_dim=32)),     # transformers' path (ON_HF)
}
ON_HF = ("gemma2",)                 # families the lean forward leaves to transformers
LEAN = [f for f in FAMILIES if f not in ON_HF]


def build(family: str, tok, seed: int, layers: int = 2, **extra):
    """A random model of `family` on the zoo tokenizer's vocabulary, every parameter drawn."""
    cfg_cls, model_cls, kw = FAMILIES[family]
    torch.manual_seed(seed)
    cfg = cfg_cls(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  initializer_range=0.3, **(kw | extra))
    model = model_cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.5)
            elif "norm" in name:                    # RMSNorm weights, q_norm / k_norm included: a scale
                p.uniform_(0.5, 1.5)                # of 0.5..1.5, Gemma's 1 + weight included
                if cfg.model_type.startswith("gemma"):
                    p.sub_(1.0)
    return model


@pytest.fixture(scope="module")
def tok(target):
    return target[1]


@pytest.fixture(scope="module")
def models(tok):
    """family -> (target, draft): the draft a one-layer model of the same family and vocabulary."""
    return {f: (build(f, tok, 0), build(f, tok, 1, layers=1)) for f in LEAN}


def test_the_deltas_are_there_to_get_wrong(models):
    """The drawn parameters make each delta matter: without it the logits would differ."""
    q2, q3 = models["qwen2"][0], models["qwen3"][0]
    assert q2.model.layers[0].self_attn.q_proj.bias.abs().max() > 0.1
    assert (q3.model.layers[0].self_attn.q_norm.weight - 1).abs().max() > 0.1
    assert q3.config.head_dim * q3.config.num_attention_heads != q3.config.hidden_size
    assert models["qwen2-tied"][0].lm_head.weight is models["qwen2-tied"][0].model.embed_tokens.weight
    gemma = models["gemma"][0]
    assert gemma.lm_head.weight is gemma.model.embed_tokens.weight and gemma.config.hidden_act == "gelu_pytorch_tanh"
    a = arch_of(gemma)
    assert a.embed_scale and a.norm_offset and a.act == "gelu_pytorch_tanh" and not a.fuses


def test_each_gemma_delta_changes_the_logits(models):
    """Gemma's logits with any one of its deltas left out are far from transformers', so the
    equality tests below would catch a forward that skipped it."""
    model, prompt = models["gemma"][0], torch.tensor([5, 9, 11, 3, 40, 41, 7, 300])
    with torch.no_grad():
        want = model(prompt[None]).logits[0]
    lm = LeanLM(model)
    assert (lm.forward(prompt) - want).abs().max() < TOL
    for leave_out in ("act", "embed_scale", "norm"):
        lm = LeanLM(model)
        if leave_out == "act":
            lm.act = F.silu
        elif leave_out == "embed_scale":
            lm.embed_scale = None
        else:
            lm.norm = model.model.norm.weight                       # w, not 1 + w, in the final norm
        assert (lm.forward(prompt) - want).abs().max() > 0.1, leave_out


@pytest.mark.parametrize("family", LEAN)
def test_the_lean_forward_runs_the_architecture(family, models):
    model = models[family][0]
    assert why_not(model) is None and supports(model)
    assert isinstance(make_lm(model, "target"), LeanLM)          # auto picks it


def _steps(lm, ref):
    """The same decode steps on both forwards; yields (step, lean logits, transformers logits)."""
    prompt = torch.tensor([5, 9, 11, 3, 40, 41, 7, 300])
    yield "prefill", lm.forward(prompt), ref.forward(prompt)
    yield "decode", lm.forward(torch.tensor([12])), ref.forward(torch.tensor([12]))
    chain = torch.tensor([13, 20, 21, 22])                      # 1 pending + 3 drafted: a chain verify
    yield "chain verify", lm.forward(chain, n_prefix=1), ref.forward(chain, n_prefix=1)
    lm.keep(11); ref.keep(11)                                   # rollback: 2 of the 3 accepted
    nxt = torch.tensor([30])
    yield "after rollback", lm.forward(nxt), ref.forward(nxt)
    parents, tree = [-1, -1, 0, 0, 1, 4], torch.tensor([31, 50, 51, 52, 53, 54, 55])
    yield ("tree verify", lm.forward(tree, parents=parents, n_prefix=1),
           ref.forward(tree, parents=parents, n_prefix=1))
    lm.keep_positions(13, [1, 4, 5]); ref.keep_positions(13, [1, 4, 5])   # the path 51 -> 54 -> 55
    nxt = torch.tensor([60, 61])
    yield "after a tree path", lm.forward(nxt), ref.forward(nxt)


@pytest.mark.parametrize("backend", ["fast", "static-eager"])     # the eager forward and the static runner
@pytest.mark.parametrize("family", LEAN)
def test_lean_logits_equal_transformers_in_every_step(family, backend, models):
    model = models[family][0]
    lm, ref = make_lm(model, "target", backend, max_len=64), CausalLM(model, "target")
    assert isinstance(lm, LeanLM)
    worst = 0.0
    for step, a, b in _steps(lm, ref):
        assert a.shape == b.shape, step
        diff = (a - b).abs().max().item()
        worst = max(worst, diff)
        assert diff < TOL, f"{family} {step}: max |lean - transformers| = {diff:.2e}"
    # the cache the steps left: prompt, 12, 13 20 (kept), 30, 31 51 54 55, 60 61, as one plain forward
    seq = torch.tensor([[5, 9, 11, 3, 40, 41, 7, 300, 12, 13, 20, 30, 31, 51, 54, 55, 60, 61]])
    with torch.no_grad():
        full = model(seq).logits[0, -2:]
    assert (a - full).abs().max().item() < TOL
    print(f"\n{family} ({backend}): fp32 max |lean - transformers| over every step = {worst:.2e}")


def _spec_methods() -> list[str]:
    """Every lossless speculative method but the EAGLE-3 ones (an EAGLE-3 drafter reads three distinct
    target layers and these targets have two: tests/test_eagle3.py pins eagle3 against ar) and
    dllm-draft (its draft is a block-diffusion LM, which these families have none of:
    tests/test_dllm_draft.py pins it against ar)."""
    return [m["name"] for m in methods() if get_method(m["name"]).engine == "speculative" and m["lossless"]
            and m["name"] != "ar" and (get_method(m["name"]).draft is None
                                       or get_method(m["name"]).draft.kind not in ("eagle3", "dllm"))]


def _draft(method: str, family: str, models, which: str):
    """The draft a method takes: the family's small model or the target itself, or random heads."""
    from speclab.models.heads import build_eagle, build_medusa, head_config
    target, small = models[family]
    kind = get_method(method).draft.kind if get_method(method).needs_draft else None
    if kind is None:
        return None
    if kind in ("draft", "sorted-draft"):   # a draft LM (S2D's: every depth a sub-draft)
        return small if which == "small" else target
    torch.manual_seed(2)
    ids = torch.arange(target.config.vocab_size)
    if kind == "clover":
        from speclab.models.clover import CloverHeads, clover_config
        head = CloverHeads(target, clover_config(target.config, n_heads=3), ids)
    elif kind == "falcon":
        from speclab.models.falcon import FalconHead, falcon_config
        head = FalconHead(target, falcon_config(target.config, n_layers=2, k=2), ids)
    elif kind == "flexdraft":           # the mask rows' deltas on the last layer: random, so they matter
        from speclab.models.flexdraft import FlexDraftAdapter, flexdraft_config
        n = target.config.num_hidden_layers
        head = FlexDraftAdapter(target, flexdraft_config(target.config, first_layer=n - 1, rank=4, alpha=8, k=3), ids)
    elif kind == "peagle":              # one forward over the real entry and a shared mask state
        from speclab.models.peagle import PEagleHead, peagle_config
        head = PEagleHead(target, peagle_config(target.config, n_layers=1, k=4), ids)
    elif kind == "ppd":                 # prompt vectors the target's own rows read
        from speclab.models.ppd import PromptTokens, ppd_config
        head = PromptTokens(target, ppd_config(target.config, 3))
    elif kind == "hidden-transfer":     # maps the state after layer 1 to pseudo states for layers 2..
        from speclab.models.hidden_transfer import HiddenTransfer, transfer_config
        head = HiddenTransfer(target, transfer_config(target.config, 1, 3))
    elif kind == "causal-tree":         # tree-causal mask rows with rank embeddings, deltas on the last layer
        from speclab.models.causal_tree import CausalTreeAdapter, causal_tree_config
        n = target.config.num_hidden_layers
        head = CausalTreeAdapter(target, causal_tree_config(target.config, n - 1, 4, 8, k=3, width=2), ids)
    elif kind == "m2r2":                # accelerator adapters on the first layer: random, so they matter
        from speclab.models.m2r2 import Accelerator, m2r2_config
        head = Accelerator(target, m2r2_config(target.config, 1, 4, 8.0))
    else:
        head = (build_eagle if kind == "eagle" else build_medusa)(target, head_config(target.config, kind, n_heads=3), ids)
    with torch.no_grad():
        for p in head.parameters():
            if p.requires_grad:
                p.normal_(0.0, 0.3)
    if kind == "eagle":                 # its one layer is a Llama: the lean forward runs it
        head.eval()
    return head


CASES = [(m, "small") for m in _spec_methods()] + [("draft-model", "self"), ("tree-dynamic", "self")]


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral", "gemma"])
def test_every_method_decodes_what_ar_decodes(family, models, tok, tmp_path):
    """fp32, greedy: every lossless speculative method of the registry against ar, on the lean
    forward (the target as its own draft accepts every token: the acceptance path runs too)."""
    target = (models[family][0], tok)
    prompt = [7, 8, 9, 7, 8, 9, 7, 8, 40, 41, 7, 8]        # repeats: the lookup methods find matches
    want = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None).ids
    assert len(want) == NEW
    for method, which in CASES:
        dft = _draft(method, family, models, which)
        params = dict(exit_layer=1) if method == "layer-skip" else {}
        if method == "specdec++":       # an acceptance head of random weights for the draft's width
            from speclab.models.acceptance_head import for_draft, save_head
            torch.manual_seed(3)
            params = dict(head=str(save_head(for_draft(dft), tmp_path / "head", {"draft": family})))
        on, ref = target, want
        if method == "swift":           # skips within layers 1..L-2: a third layer to skip
            on = (build(family, tok, 0, layers=3), tok)
            ref = speclab.generate(on, prompt, "ar", max_new_tokens=NEW, record=None).ids
        r = speclab.generate(on, prompt, method, draft=(dft, tok) if dft is not None else None,
                             max_new_tokens=NEW, record=None, **params)
        assert r.ids == ref, f"{family} {method} ({which} draft) differs from ar"
        if which == "self":
            assert r.trace.totals.tau > 2, f"{family} {method}: the target as its own draft was rejected"


def test_a_sliding_window_runs_lean_within_it_and_on_transformers_past_it(tok):
    """Mistral 7B v0.1 slides a window over the keys; a request that stays inside it sees every
    earlier position either way, so the lean forward runs it; a longer one runs on transformers."""
    model = build("mistral", tok, 3, sliding_window=100)
    assert "sliding window of 100" in why_not(model)                     # 256 positions by default
    assert isinstance(make_lm(model, max_len=90), LeanLM)
    assert isinstance(make_lm(model, max_len=110), CausalLM)
    with pytest.raises(ValueError, match="sliding window of 100"):
        make_lm(model, backend="fast", max_len=110)
    lm, ref = LeanLM(model), CausalLM(model)
    prompt = torch.arange(3, 99)
    assert (lm.forward(prompt) - ref.forward(prompt)).abs().max() < TOL
    with pytest.raises(ValueError, match="past mistral's sliding window of 100"):
        lm.forward(torch.arange(5))                                      # 101 positions
    # through the API the request's reach decides (prompt + new tokens + a verify's room of 64):
    # 8 + 6 inside the window, 8 + 40 past it; both decode what transformers' ar decodes
    ids = [7, 8, 9, 7, 8, 9, 7, 8]
    for new, forward in ((6, "LeanLM"), (40, "CausalLM")):
        want = speclab.generate((model, tok), ids, "ar", max_new_tokens=new, record=None, backend="hf").ids
        for method in ("ar", "prompt-lookup"):
            r = speclab.generate((model, tok), ids, method, max_new_tokens=new, record=None)
            assert r.ids == want and r.trace.models["target"].backend == forward


def test_a_saved_qwen2_checkpoint_runs_lean_from_the_cli(tok, tmp_path, capsys):
    """`speclab run --target DIR` on a Qwen2 checkpoint saved by transformers (safetensors) runs the
    lean forward, and the trace says which forward ran the target."""
    import json

    from speclab.cli import main
    from speclab.trace import Trace
    model = build("qwen2", tok, 4)
    model.save_pretrained(tmp_path / "qwen2")
    tok.save_pretrained(tmp_path / "qwen2")
    assert (tmp_path / "qwen2" / "model.safetensors").exists()
    code = main(["run", "--target", str(tmp_path / "qwen2"), "--prompt", "def add(a, b):", "--method", "prompt-lookup",
                 "--max-new-tokens", "8", "--dtype", "fp32", "--check", "--json", "--trace", str(tmp_path / "t.json")])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0 and out["identical"] and len(out["ids"]) == 8
    info = Trace.load(tmp_path / "t.json").models["target"]
    assert info.backend == "LeanLM" and info.dtype == "float32" and info.device == "cpu"
    assert "LeanLM" in info.runs_on()


@pytest.mark.parametrize("backend", ["fast", "static-eager"])
@pytest.mark.parametrize("family", ["gemma", "qwen3"])
def test_bf16_off_the_fused_layer_call_decodes_what_ar_decodes(family, backend, tok):
    """bf16: the native kernel's layer call computes Llama's norm and SiLU layer only, so it is off
    for Gemma (its norm, GELU-tanh) and Qwen3 (q / k norms); the kernel's per-matrix product runs
    where the CPU has it, the deltas as torch ops around it, and every method decodes what ar does."""
    model = build(family, tok, 5).to(torch.bfloat16)
    lm = make_lm(model, "target", backend, max_len=64)
    assert not lm.fused and lm.layout == ("packed" if kernels.available("cpu", torch.bfloat16) else "out_in")
    target, prompt = (model, tok), [7, 8, 9, 7, 8, 9, 7, 8, 40, 41, 7, 8]
    want = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None, backend=backend).ids
    assert len(want) == NEW and len(set(want)) > 2
    for method, draft in (("prompt-lookup", None), ("draft-model", model), ("tree-dynamic", model)):
        r = speclab.generate(target, prompt, method, draft=(draft, tok) if draft is not None else None,
                             max_new_tokens=NEW, record=None, backend=backend)
        assert r.ids == want, f"bf16 {family} {backend} {method} differs from ar"
        assert r.trace.models["target"].dtype == "bfloat16"


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_chains_roll_back_past_a_sliding_window_and_trees_say_what_to_do(family, tok):
    """On transformers' path a sliding-window cache drops the keys that leave the window; a rejected
    draft past the window rolls back into them, so the cache records them until the crop. A draft
    tree there would need the window in its mask: it is refused with what to run instead."""
    extra = dict(sliding_window=16) | (dict(head_dim=32) if family == "gemma2" else {})
    model, other = build(family, tok, 3, **extra), build(family, tok, 4, layers=1, **extra)
    ids = [7, 8, 9, 7, 8, 9, 7, 8]
    want = speclab.generate((model, tok), ids, "ar", max_new_tokens=40, record=None).ids
    assert len(want) == 40
    for method, draft in (("prompt-lookup", None), ("draft-model", other), ("draft-model", model)):
        r = speclab.generate((model, tok), ids, method, draft=None if draft is None else (draft, tok),
                             max_new_tokens=40, record=None)
        assert r.ids == want and r.trace.models["target"].backend == "CausalLM", method
    with pytest.raises(ValueError, match="past its sliding window of 16: use a chain method"):
        speclab.generate((model, tok), ids, "tree-dynamic", draft=(model, tok), max_new_tokens=40, record=None)


def test_gemma2_and_gemma3_run_on_transformers_and_decode_what_ar_decodes(tok):
    """Gemma 2 / 3 (soft-capping, norms after each sublayer, alternating local / global layers)
    are not deltas of Llama: auto picks transformers' forward, which every method decodes on."""
    torch.manual_seed(6)
    g3 = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=32, max_position_embeddings=256))
    model = build("gemma2", tok, 6)
    for m in (model, g3):
        assert "soft-caps" in why_not(m) and resolve(m) == "hf" and isinstance(make_lm(m), CausalLM)
        with pytest.raises(ValueError, match="soft-caps"):
            make_lm(m, backend="fast")
    target, prompt = (model, tok), [7, 8, 9, 7, 8, 9, 7, 8, 40, 41, 7, 8]
    want = speclab.generate(target, prompt, "ar", max_new_tokens=NEW, record=None).ids
    assert len(want) == NEW
    for method, draft in (("prompt-lookup", None), ("draft-model", model), ("tree-dynamic", model)):
        r = speclab.generate(target, prompt, method, draft=(draft, tok) if draft is not None else None,
                             max_new_tokens=NEW, record=None)
        assert r.ids == want and r.trace.models["target"].backend == "CausalLM", method
        if draft is not None:
            assert r.trace.totals.tau > 2, f"{method}: the target as its own draft was rejected"


def test_a_gemma_batch_decodes_what_each_prompt_decodes_alone(models, tok):
    """B Gemma sequences in one lean slot space (LeanBatchLM): each gets what ar gives it alone."""
    target = (models["gemma"][0], tok)
    prompts = [[7, 8, 9, 7, 8, 9, 7, 8], [40, 41, 7, 8, 300, 12], [5, 9, 11]]
    alone = [speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None).ids for p in prompts]
    for method in ("ar", "prompt-lookup"):
        batch = speclab.generate(target, prompts, method, max_new_tokens=NEW, record=None)
        assert [r.ids for r in batch] == alone, method


def test_gemma_static_steps_compile_without_graph_breaks(models):
    """Gemma's deltas (the embedding scale, the 1 + weight norm, GELU-tanh) inside the static
    runner's step compile with fullgraph=True (what CUDA graph capture needs) and give its logits."""
    from speclab.models.lean.static import StaticLM
    lm = StaticLM(models["gemma"][0], graphs=False)
    ids = torch.tensor([5, 9, 11, 3, 40, 41, 7, 300, 12, 13, 20, 21])
    lm.forward(ids[:8])
    torch._dynamo.reset()
    step = torch.compile(lm._step, fullgraph=True, backend="eager", dynamic=False)
    for W, parents in ((1, None), (4, [-1, 0, 0, 1])):
        base = lm.length
        eager = lm.forward(ids[8:8 + W], parents=parents)            # stages the buffers
        lm.keep(base)
        with torch.inference_mode():
            assert torch.equal(step(W, W, 0, None, (), parents is None)[:W], eager)   # a chain: its own mask
    torch._dynamo.reset()
