"""EAGLE-3 drafters in the standard layout (speclab.models.eagle3, decoding/drafters/eagle3.py):
synthetic checkpoints of both namings (speculators `layers.0.*`, SpecForge `midlayer.*`) built from
a random-init Llama target, loaded offline; the errors of a wrong pairing; greedy identical to ar in
fp32 (chain and tree); the second sampled token's law; the exported directory read back with plain
safetensors + json against the names vLLM's llama_eagle3.py and speculators read."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import speclab
from conftest import sampled_drafts_are_point_mass
from speclab.decoding.drafters.eagle3 import Eagle3ChainDrafter, Eagle3Drafter
from speclab.models import eagle3 as E
from speclab.models.eagle3_export import export

N_LAYERS, V, N_DRAFT = 8, 8192, 3000
AUX = [2, 4, 8]             # the last one is the final state (speclab captures it; vLLM's default is (2, 4, 5))


@pytest.fixture(scope="module")
def tiny(target):
    """A random-init 8-layer Llama over the code zoo's tokenizer, named like a hub model."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=N_LAYERS,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(cfg).eval()
    model.name_or_path = "tiny-llama"
    return model, target[1]


def make_draft(model, seed=1, aux=AUX, n_draft=N_DRAFT) -> E.Eagle3Draft:
    """A random EAGLE-3 draft over a random draft vocabulary of N_DRAFT target ids, its fc reading the
    last aux state almost alone: on the looping text a random target writes, that drafts tokens the
    target accepts, so accepted paths are exercised too."""
    torch.manual_seed(seed)
    d = E.new_draft(model.config, n_draft, aux, verifier={"name_or_path": "org/tiny-llama",
                                                          "architectures": ["LlamaForCausalLM"]})
    ids = torch.randperm(model.config.vocab_size)[:n_draft]
    d.set_vocab(ids)
    C = model.config.hidden_size
    with torch.no_grad():
        for p in d.parameters():
            p.normal_(0, 0.02)
        d.fc.weight[:, -C:] += torch.eye(C)
        for n in (d.norm, d.layers[0].input_layernorm, d.layers[0].hidden_norm, d.layers[0].post_attention_layernorm):
            n.weight.fill_(1.0)
        d.norm.weight.copy_(model.model.norm.weight)
        d.lm_head.weight.copy_(model.lm_head.weight[d.draft_ids])
    return d.eval().requires_grad_(False)


def write_speculators(d: E.Eagle3Draft, where):
    """By hand, as speculators writes it (not through speclab's export)."""
    where.mkdir(parents=True)
    sd = {k: v.clone().contiguous() for k, v in d.state_dict().items()}
    save_file(sd, str(where / "model.safetensors"))
    layer = {k: v for k, v in d.config.to_dict().items()
             if k not in ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "verifier",
                          "eagle_aux_hidden_state_layer_ids")}
    (where / "config.json").write_text(json.dumps({
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", "speculators_version": "0.2.0",
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy",
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                               "verifier": d.config.verifier},
        "transformer_layer_config": layer, "draft_vocab_size": N_DRAFT, "target_hidden_size": 64,
        "norm_before_residual": False, "eagle_aux_hidden_state_layer_ids": AUX}))


def write_specforge(d: E.Eagle3Draft, where):
    """As SpecForge / the EAGLE repository write it: midlayer.*, a LlamaForCausalLMEagle3 config,
    the embedding shipped, t2d only implied by d2t."""
    where.mkdir(parents=True)
    sd = {k.replace("layers.0.", "midlayer."): v.clone().contiguous() for k, v in d.state_dict().items()}
    sd["embed_tokens.weight"] = d._target_embed.clone()
    save_file(sd, str(where / "model.safetensors"))
    cfg = {k: v for k, v in d.config.to_dict().items() if k not in ("verifier", "eagle_aux_hidden_state_layer_ids")}
    cfg.update(architectures=["LlamaForCausalLMEagle3"], eagle_config={"eagle_aux_hidden_state_layer_ids": AUX})
    (where / "config.json").write_text(json.dumps(cfg))


def run(tiny, drafter, n=16, record="light", **kw):
    return speclab.generate(tiny, list(range(40, 52)), drafter, max_new_tokens=n, record=record, **kw)


def test_both_namings_load_to_the_same_drafts(tiny, tmp_path):
    model = tiny[0]
    d = make_draft(model)
    d._target_embed = model.get_input_embeddings().weight.detach()
    write_speculators(d, tmp_path / "spec")
    write_specforge(d, tmp_path / "forge")
    a, b = E.load(tmp_path / "spec"), E.load(tmp_path / "forge")
    assert (a.format, b.format) == ("speculators", "specforge")
    assert a.embed_tokens is None and b.embed_tokens is not None     # the target's, or its own copy of it
    assert torch.equal(a.draft_ids, d.draft_ids) and torch.equal(b.draft_ids, d.draft_ids)
    assert torch.equal(a.t2d, b.t2d) and int(a.t2d.sum()) == N_DRAFT
    assert list(a.aux_layers(N_LAYERS)) == list(b.aux_layers(N_LAYERS)) == AUX
    ra, rb = run(tiny, Eagle3Drafter(model, a, threshold=None)), run(tiny, Eagle3Drafter(model, b, threshold=None))
    trees = [[(n.token, n.parent) for n in r.nodes] for r in ra.trace.rounds]
    assert trees == [[(n.token, n.parent) for n in r.nodes] for r in rb.trace.rounds] and any(trees)
    first = next(r for r in ra.trace.rounds if r.nodes)
    assert first.info["drafter"] == {"format": "speculators", "source": str(tmp_path / "spec")}
    assert {n.source for n in first.nodes if n.depth == 1} == {f"h{11}@L2,4,8"}
    from speclab.figures.tree import source_text
    assert "layers 2, 4, 8" in source_text("h11+1@L2,4,8")


def test_a_wrong_pairing_says_what_to_do(tiny, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    model = tiny[0]
    d = make_draft(model)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=N_LAYERS,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    other.name_or_path = "tiny-llama"
    with pytest.raises(ValueError, match="target hidden states of size 64, but the target has hidden_size 32"):
        Eagle3ChainDrafter(other, d)
    small_vocab = LlamaForCausalLM(LlamaConfig(vocab_size=V // 2, hidden_size=64, intermediate_size=64,
                                               num_hidden_layers=N_LAYERS, num_attention_heads=4,
                                               num_key_value_heads=2)).eval()
    small_vocab.name_or_path = "tiny-llama"
    with pytest.raises(ValueError, match="vocabulary of 8192 tokens, but the target has 4096"):
        Eagle3ChainDrafter(small_vocab, d)
    model.name_or_path = "another-model"
    try:
        with pytest.raises(ValueError, match="trained for the verifier 'org/tiny-llama'.*verifier=False"):
            Eagle3ChainDrafter(model, d)
        Eagle3ChainDrafter(model, d, verifier=False)                        # the way round it
    finally:
        model.name_or_path = "tiny-llama"
    with pytest.raises(ValueError, match="reads target layers \\[2, 4, 9\\] but the target has 8"):
        Eagle3ChainDrafter(model, make_draft(model, aux=[2, 4, 9]))
    with pytest.raises(ValueError, match="reads target layers \\[2, 4, 4\\]"):
        Eagle3ChainDrafter(model, make_draft(model, aux=[2, 4, 4]))
    with pytest.raises(ValueError, match="needs an EAGLE-3 drafter"):
        Eagle3ChainDrafter(model, model)
    # directories that are not EAGLE-3 checkpoints
    bad = tmp_path / "bad"
    write_speculators(d, bad)
    sd = load_file(str(bad / "model.safetensors"))
    del sd["fc.weight"]
    save_file(sd, str(bad / "model.safetensors"))
    with pytest.raises(ValueError, match="missing \\['fc.weight'\\]"):
        E.load(bad)
    (bad / "model.safetensors").unlink()
    (bad / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ValueError, match="no .safetensors weights .*pytorch_model.bin"):
        E.load(bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps(dict(cfg, speculators_model_type="eagle")))
    with pytest.raises(ValueError, match="speculators 'eagle' drafter, not eagle3"):
        E.load(bad)
    with pytest.raises(ValueError, match="has no config.json"):
        E.load(tmp_path)


CASES = [(Eagle3ChainDrafter, dict(k=3)), (Eagle3ChainDrafter, dict(schedule="heuristic")),
         (Eagle3Drafter, dict(budget=8, width=3, depth=4, threshold=None)), (Eagle3Drafter, dict())]


@pytest.mark.parametrize("cls,params", CASES, ids=[f"{c[0].name}-{i}" for i, c in enumerate(CASES)])
def test_greedy_identical_to_ar(cls, params, tiny):
    model = tiny[0]
    d = make_draft(model)
    drafted = accepted = 0
    for start in (40, 300):
        prompt = list(range(start, start + 12))
        ref = speclab.generate(tiny, prompt, "ar", max_new_tokens=24, record=None).ids
        r = speclab.generate(tiny, prompt, cls(model, d, **params), max_new_tokens=24)
        assert r.ids == ref
        t = r.trace.totals
        assert not r.trace.rounds[0].drafted and t.draft_forwards > 0
        drafted, accepted = drafted + t.drafted, accepted + t.accepted
    assert drafted > 0 and accepted > 0                 # drafts are made, and some of them are right


def test_sampled_trees_are_point_mass(tiny):
    """Sampled, the tree of the draft's top choices tells the rule no q: its law is the point-mass
    tree walk's, tested with power in test_sampling_power.py."""
    model = tiny[0]
    sampled_drafts_are_point_mass(tiny, Eagle3Drafter(model, make_draft(model), budget=6, width=2, depth=3),
                                  prompt=list(range(40, 52)))


@pytest.mark.usefixtures("one_thread")
def test_the_sampled_chain_follows_the_target():
    """Round 1 has no draft, so the drafted position is the second token: the chain's q, widened from
    the draft's own ids to the target's (-inf elsewhere), keeps the first two tokens' law the target's
    (sampling_law: N draws at T = 1; the feature-head family's walk at T = 0.7 and 1 and its broken
    variant: test_sampling_power.py). A three-layer target of 16 ids, drafted from 12 of them."""
    from sampling_law import draw_pairs, follows, target_law
    from transformers import LlamaConfig, LlamaForCausalLM

    from speclab.decoding.acceptance import Sampler
    from speclab.models.backends import make_lm
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      initializer_range=0.3, tie_word_embeddings=True, architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(cfg).eval()
    model.name_or_path = "tiny-llama"
    prompt, sampler = [1, 2, 3], Sampler(1.0)
    drafter = Eagle3ChainDrafter(model, make_draft(model, aux=[1, 2, 3], n_draft=12), k=2)
    follows(target_law(model, prompt, sampler), draw_pairs(make_lm(model, "target"), drafter, prompt, sampler))


# what vLLM 0.32's llama_eagle3.py (Eagle3LlamaForCausalLM.load_weights) and speculators' eagle3 reader
# look up, with the shapes they build: q/k/v read 2 x hidden (the normed embedding and feature),
# fc reads 3 x target hidden
def expected_weights(C, Ct, nh, nkv, hd, I, N):
    return {
        "layers.0.self_attn.q_proj.weight": (nh * hd, 2 * C), "layers.0.self_attn.k_proj.weight": (nkv * hd, 2 * C),
        "layers.0.self_attn.v_proj.weight": (nkv * hd, 2 * C), "layers.0.self_attn.o_proj.weight": (C, nh * hd),
        "layers.0.mlp.gate_proj.weight": (I, C), "layers.0.mlp.up_proj.weight": (I, C),
        "layers.0.mlp.down_proj.weight": (C, I), "layers.0.input_layernorm.weight": (C,),
        "layers.0.hidden_norm.weight": (C,), "layers.0.post_attention_layernorm.weight": (C,),
        "fc.weight": (C, 3 * Ct), "norm.weight": (C,), "lm_head.weight": (N, C), "d2t": (N,), "t2d": (V,),
    }


def test_export_writes_what_vllm_and_speculators_read(tiny, tmp_path):
    model = tiny[0]
    d = make_draft(model)
    out = export(d, tmp_path / "out", k=4)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]   # no temporary left
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["architectures"] == ["Eagle3Speculator"]
    assert isinstance(cfg["speculators_version"], str)
    sc = cfg["speculators_config"]
    assert sc["algorithm"] == "eagle3" and sc["default_proposal_method"] == "greedy"
    assert sc["proposal_methods"][0]["speculative_tokens"] == 4          # vLLM's num_speculative_tokens
    assert sc["verifier"] == {"name_or_path": "org/tiny-llama", "architectures": ["LlamaForCausalLM"]}
    layer = cfg["transformer_layer_config"]
    assert layer["model_type"] == "llama" and layer["num_hidden_layers"] == 1
    assert layer["vocab_size"] == V and layer["hidden_size"] == 64 and layer["num_attention_heads"] == 4
    assert layer["num_key_value_heads"] == 2 and layer["intermediate_size"] == 128 and "rms_norm_eps" in layer
    assert cfg["draft_vocab_size"] == N_DRAFT and cfg["target_hidden_size"] == 64
    assert cfg["norm_before_residual"] is False                    # explicit: vLLM reads a missing one as true
    assert cfg["eagle_aux_hidden_state_layer_ids"] == AUX
    sd = load_file(str(out / "model.safetensors"))
    want = expected_weights(64, 64, 4, 2, 16, 128, N_DRAFT)
    assert {k: tuple(v.shape) for k, v in sd.items()} == want      # embed_tokens not shipped: the target's is used
    assert sd["d2t"].dtype == torch.int64 and sd["t2d"].dtype == torch.bool
    assert sd["fc.weight"].dtype == torch.bfloat16
    ids = torch.arange(N_DRAFT) + sd["d2t"]                         # draft id -> target id, as vLLM maps logits
    assert torch.equal(ids, d.draft_ids) and torch.equal(sd["t2d"].nonzero()[:, 0], ids)
    # and it loads back into speclab: the same drafts as the draft it came from, in its bf16 weights
    back = E.load(out)
    assert back.format == "speculators"
    ref = {k: v.to(torch.bfloat16).float() for k, v in d.state_dict().items() if v.is_floating_point()}
    assert all(torch.equal(back.state_dict()[k], v) for k, v in ref.items())
    export(back, tmp_path / "out")                                # over an existing directory, atomically
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "model.safetensors"]


def test_training_forward_equals_drafting_forward(tiny):
    """train/eagle3.ttt_forward (the training-time test over a mask) gives, at step 1 and step 2, the
    outputs the drafter computes with its cache: step 1 over committed entries, step 2 from its own
    output at the entry before."""
    from speclab.train.eagle3 import ttt_forward
    model = tiny[0]
    d = make_draft(model).float()
    tok = torch.arange(100, 120)[None]
    with torch.no_grad():
        hs = model(input_ids=tok, output_hidden_states=True).hidden_states       # [i]: the state after i layers
        aux = [hs[l] for l in AUX]
        embed = model.get_input_embeddings().weight
        o = ttt_forward(d, aux, tok, 2, embed)                                   # (2, 1, 19, C)
        g = d.fuse(torch.cat([a[0] for a in aux], -1))                          # (20, C)
        cache = E.Cache()
        normed, pre = d(tok[0, 1:], g[:-1], cache, embed=embed)                 # step 1, entries 0..18
        assert torch.allclose(o[0, 0], normed, atol=1e-5)
        t = 10                                                                  # step 2 at entry t: output at t-1
        cache.keep(t)
        n2, _ = d(tok[0, t + 1:t + 2], pre[t - 1:t], cache, embed=embed)
        assert torch.allclose(o[1, 0, t], n2[0], atol=1e-5)


def test_vllm_eagle3_peer_request(tiny, tmp_path):
    """vllm-eagle3[model=DIR]: vLLM's speculative_config names the directory as is; anything but an
    EAGLE-3 checkpoint fails in one line before vLLM starts."""
    from speclab.bench import vllm_peer as vp
    out = export(make_draft(tiny[0]), tmp_path / "e3", k=4)
    assert vp.vllm_eagle3_dir(str(out)) == str(out)
    assert vp.speculative_config("vllm-eagle3", draft_dir=str(out)) == dict(method="eagle3", model=str(out),
                                                                            num_speculative_tokens=4)
    req = vp.build_request("vllm-eagle3", "/m", [[1, 2, 3]], 8, k=3, draft_dir=str(out))
    assert req["speculative_config"]["num_speculative_tokens"] == 3
    with pytest.raises(ValueError, match="speclab head.*speclab train eagle3 --init-from smollm2-eagle"):
        vp.vllm_eagle3_dir("smollm2-eagle")
    with pytest.raises(ValueError, match="needs an EAGLE-3 drafter"):
        vp.speculative_config("vllm-eagle3")
    with pytest.raises(ValueError, match="not an EAGLE-3 drafter"):
        vp.vllm_eagle3_dir("code-draft")


def test_export_drafter_turns_a_specforge_checkpoint_into_a_speculators_directory(tiny, tmp_path, capsys):
    from speclab.cli import main
    model = tiny[0]
    d = make_draft(model)
    d._target_embed = model.get_input_embeddings().weight.detach()
    write_specforge(d, tmp_path / "forge")
    assert main(["export-drafter", str(tmp_path / "forge"), str(tmp_path / "spec"), "--verifier", "org/tiny-llama"]) == 0
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["eagle_aux_hidden_state_layer_ids"] == AUX
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == "org/tiny-llama"
    sd = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert "layers.0.hidden_norm.weight" in sd and not any(k.startswith("midlayer.") for k in sd)
    assert "embed_tokens.weight" in sd                     # a shipped embedding travels with it
    a, b = E.load(tmp_path / "forge"), E.load(tmp_path / "spec")
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    assert main(["export-drafter", "smollm2-eagle", str(tmp_path / "x")]) == 2
    assert "speclab train eagle3 --init-from smollm2-eagle" in capsys.readouterr().err


def test_a_few_training_steps_lower_the_loss(tiny):
    from speclab.train.eagle3 import ttt_loss
    model = tiny[0]
    d = make_draft(model).float().train().requires_grad_(True)
    d.lm_head.requires_grad_(False)
    tok = torch.randint(0, V, (2, 24))
    with torch.no_grad():
        hs = model(input_ids=tok, output_hidden_states=True).hidden_states
        lp = (model.lm_head.weight[d.draft_ids] @ model.model.norm(hs[-1]).transpose(1, 2)).transpose(1, 2).log_softmax(-1)
    m = torch.ones_like(tok, dtype=torch.bool)
    opt = torch.optim.Adam([p for p in d.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for _ in range(8):
        loss, st = ttt_loss(d, tok, [hs[l] for l in AUX], lp, m, 3, model.get_input_embeddings().weight)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] and set(st) == {"acc1", "acc2", "acc3", "n1", "n2", "n3"}


def test_packed_layers_compute_the_same_draft(tiny):
    """Where speclab's bf16 CPU kernel runs, the drafter's packed linear layers give the draft's own
    outputs (to bf16 rounding)."""
    model = tiny[0]
    d = make_draft(model).to(torch.bfloat16)
    fast = d.packed()
    if fast is None:
        pytest.skip("speclab's bf16 kernel does not run on this machine")
    g = torch.randn(6, 3 * 64, dtype=torch.bfloat16)
    tok, embed = torch.arange(200, 206), model.get_input_embeddings().weight.to(torch.bfloat16)
    outs = [d(tok, d.fuse(g, f), E.Cache(), embed=embed, fast=f) for f in (None, fast)]
    for a, b in zip(outs[0], outs[1]):
        assert torch.allclose(a.float(), b.float(), atol=0.05, rtol=0.05)
    assert torch.allclose(d.logits(outs[0][0]).float(), d.logits(outs[0][0], fast).float(), atol=0.05, rtol=0.05)


def test_eagle3_runs_by_name_with_its_directory_as_the_draft(tiny, tmp_path):
    """`eagle3` / `eagle3-chain` from the registry: the draft is a directory (loaded in the target's
    dtype), the parameters are the drafter's, and greedy output is ar's."""
    from speclab.decoding.registry import method_params
    model = tiny[0]
    out = export(make_draft(model), tmp_path / "e3", dtype=None)       # fp32 weights: the run stays fp32
    prompt = list(range(40, 52))
    ref = speclab.generate(tiny, prompt, "ar", max_new_tokens=16, record=None).ids
    for method, params in (("eagle3", dict(budget=6)), ("eagle3-chain", dict(k=3))):
        r = speclab.generate(tiny, prompt, method, draft=str(out), max_new_tokens=16, **params)
        assert r.ids == ref and r.trace.totals.drafted > 0
        assert r.trace.models["draft"].name == str(out)
    assert {"budget", "width", "depth", "threshold", "verifier"} <= set(method_params("eagle3"))
    assert {"k", "verifier"} <= set(method_params("eagle3-chain"))
    with pytest.raises(ValueError, match="needs an EAGLE-3 drafter"):
        speclab.generate(tiny, prompt, "eagle3", draft=(model, tiny[1]), max_new_tokens=4)
