"""Batch > 1 (speclab.decoding.batch): B sequences decoded together, one target forward per round,
each sequence token for token what decoding it alone gives; per-lane traces that replay; sampling
that keeps each lane's target distribution; one-line errors for what a batch cannot do."""
import copy
import json
import re

import pytest
import torch
from scipy.stats import chisquare

import speclab
from speclab.decoding.acceptance import Sampler, warp
from speclab.decoding.registry import batch_methods
from speclab.models.hf import BatchCausalLM
from speclab.models.lean.batch import LeanBatchLM
from speclab.trace import Trace, replay

NEW = 32
METHODS = [("ar", {}), ("prompt-lookup", {}), ("draft-model", dict(k=4)), ("tree-dynamic", dict(budget=8, width=3))]
MORE = [("suffix", {}), ("recycling", {}), ("lookahead", {}), ("tree-static", {}),
        ("draft-model", dict(threshold=0.4, max_k=8)), ("prompt-lookup", dict(grow=4, k=12))]


pytestmark = pytest.mark.usefixtures("one_thread")     # multi-row fp32 toy products (conftest)


@pytest.fixture(scope="module")
def prompts(heldout_prompts):
    """8 prompts of 83..227 tokens."""
    return heldout_prompts[:8]


@pytest.fixture(scope="module")
def alone(target, prompts):
    return [speclab.generate(target, p, "ar", max_new_tokens=NEW, record=None).ids for p in prompts]


def _ids(m, p):
    return m[1](p, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("B", [1, 3, 8])
@pytest.mark.parametrize("method,params", METHODS, ids=[m for m, _ in METHODS])
def test_batch_equals_each_prompt_alone(method, params, B, target, draft, prompts, alone):
    rs = speclab.generate(target, prompts[:B], method, draft=draft, max_new_tokens=NEW, record=None, **params)
    assert isinstance(rs, list) and len(rs) == B
    for b, r in enumerate(rs):
        assert r.ids == alone[b], f"{method} lane {b} of {B} diverged from ar alone"
        assert r.trace.params["batch_size"] == B and r.trace.params["lane"] == b


@pytest.mark.parametrize("method,params", MORE, ids=[f"{m}-{'-'.join(map(str, p.values()))}" for m, p in MORE])
def test_more_methods_in_a_batch(method, params, target, draft, prompts, alone):
    picks = [3, 0, 7]                                   # 109, 189 and 83 tokens
    rs = speclab.generate(target, [prompts[i] for i in picks], method, draft=draft, max_new_tokens=NEW,
                          record=None, **params)
    assert [r.ids for r in rs] == [alone[i] for i in picks]


def test_single_prompts_are_unchanged(target, prompts, alone):
    r = speclab.generate(target, prompts[0], "ar", max_new_tokens=NEW, record=None)
    assert not isinstance(r, list) and r.ids == alone[0] and "lane" not in r.trace.params
    ids = _ids(target, prompts[0])                      # a list of token ids is still ONE prompt
    assert speclab.generate(target, ids, "ar", max_new_tokens=NEW, record=None).ids == alone[0]
    rs = speclab.generate(target, [ids, prompts[1]], "ar", max_new_tokens=NEW, record=None)   # ids and text mix
    assert [r.ids for r in rs] == alone[:2]


@pytest.fixture(scope="module")
def tiny_llamas(target):
    """Real transformers Llamas from small configs, random weights, on the zoo tokenizer: a plain one,
    one with attention biases and grouped KV heads (the lean forward adds the biases: lean.archs),
    and a draft. Transformers' own batch rows are tested with backend="hf" below."""
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = target[1]

    def make(seed, **kw):
        torch.manual_seed(seed)
        cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, max_position_embeddings=512, initializer_range=0.3, **kw)
        return LlamaForCausalLM(cfg).eval(), tok
    return {"plain": make(0, num_key_value_heads=4), "bias-gqa": make(1, num_key_value_heads=2, attention_bias=True),
            "draft": make(2, num_key_value_heads=2)}


LLAMA_CASES = [("ar", {}, None), ("prompt-lookup", {}, None), ("draft-model", dict(k=3), "other"),
               ("draft-model", dict(k=3), "self"), ("tree-static", {}, "self")]


@pytest.mark.parametrize("which", ["plain", "bias-gqa"])
@pytest.mark.parametrize("method,params,drafter", LLAMA_CASES, ids=[f"{m}-{d}" for m, _, d in LLAMA_CASES])
def test_batch_on_transformers_llamas(which, method, params, drafter, tiny_llamas, prompts):
    """A random draft is always rejected; the target as its own draft is always accepted (a tree:
    its top-1 path, slots that are not contiguous in the verify)."""
    tgt = tiny_llamas[which]
    dft = {"other": tiny_llamas["draft"], "self": tgt}.get(drafter)
    ps = [prompts[3], "def f(x):", prompts[7]]
    ref = [speclab.generate(tgt, p, "ar", max_new_tokens=24, record=None).ids for p in ps]
    rs = speclab.generate(tgt, ps, method, draft=dft, max_new_tokens=24, record=None, **params)
    assert [r.ids for r in rs] == ref
    if drafter == "self":
        assert all(r.trace.totals.tau > 2 for r in rs)


def _rows_see_only_their_own_keys(lm, alone, close):
    """A batch cache against each sequence alone: ragged prefill, a tree in one row and a chain in
    another, non-contiguous kept slots, compaction and a row leaving; each row scoring only its last
    k inputs (logits_to_keep: a prompt's rows are not read) or all of them."""
    ps = [[5, 9, 11, 3], [7, 8], [1, 2, 3, 4, 5, 6, 7]]
    lg = lm.forward([(p, None, len(p)) for p in ps], logits_to_keep=[1, 0, 3])          # (3, 3, V)
    assert lg.shape[1] == 3 and close(lg[0, 0], alone(ps[0])[-1])
    assert close(lg[1, :2], alone(ps[1])) and close(lg[2, :3], alone(ps[2])[-3:])
    for b, p in enumerate(ps):
        lm.keep(b, len(p) - 1, [])                                          # the last token stays pending
    parents, tokens = [-1, -1, 0, 0, 1], [20, 21, 22, 23, 24]
    lg = lm.forward([([3] + tokens, parents, 1), ([8, 30, 31], [-1, 0], 1), ([7], [], 1)], logits_to_keep=[0, 2, 0])
    for node, path in {2: [0, 2], 3: [0, 3], 4: [1, 4]}.items():            # each tree leaf as its path alone
        assert close(lg[0, 1 + node], alone(ps[0] + [tokens[i] for i in path])[-1])
    assert close(lg[1, :2], alone([7, 8, 30, 31])[2:]) and close(lg[2, 0], alone(ps[2])[-1])
    lm.keep(0, 1, [1, 4])                                                   # path 21 -> 24
    lm.keep(1, 1, [0])
    lm.keep(2, 1, [])
    width = lm.width
    lm.compact()
    assert lm.width < width and [lm.length(b) for b in range(3)] == [6, 3, 7]
    lm.retain([0, 2])
    lg = lm.forward([([2], None, 1), ([50], None, 1)])
    assert close(lg[0, 0], alone([5, 9, 11, 3, 21, 24, 2])[-1]) and close(lg[1, 0], alone(ps[2] + [50])[-1])


def test_batch_cache_rows_see_only_their_own_keys(tiny_llamas):
    """BatchCausalLM (rows of a transformers cache) against CausalLM alone."""
    from speclab.models.hf import CausalLM
    m = tiny_llamas["bias-gqa"][0]
    _rows_see_only_their_own_keys(BatchCausalLM(m, 3), lambda ids: CausalLM(m).forward(torch.tensor(ids)),
                                  lambda a, b: torch.allclose(a, b, atol=1e-4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shared_slot_cache_rows_see_only_their_own_keys(tiny_llamas, dtype):
    """LeanBatchLM (one lean-forward slot space for every sequence) against the lean forward alone.
    In bf16 on an x86 CPU with AVX2 (the fused kernel) each sequence's logits are bit for bit its
    logits alone, whatever the other sequences hold."""
    import copy as _copy
    from speclab.models import kernels
    from speclab.models.lean.forward import LeanLM
    m = _copy.deepcopy(tiny_llamas["plain"][0]).to(dtype)
    lm = LeanBatchLM(m, 3)
    alone = lambda ids: LeanLM(m).forward(torch.tensor(ids))
    bitwise = dtype == torch.bfloat16 and kernels.available("cpu", dtype)
    close = torch.equal if bitwise else (lambda a, b: torch.allclose(a, b, atol=1e-4 if dtype == torch.float32 else 0.1))
    _rows_see_only_their_own_keys(lm, alone, close)


def test_shared_slot_cache_grows_when_compaction_is_not_enough(tiny_llamas):
    from speclab.models.lean.forward import LeanLM
    m = tiny_llamas["plain"][0]
    lm = LeanBatchLM(m, 1)
    assert lm.lm.max_len == 512
    ids = torch.randint(5, 200, (550,), generator=torch.Generator().manual_seed(0)).tolist()
    lm.forward([(ids[:300], None, 300)])
    lm.keep(0, 300, [])
    lg = lm.forward([(ids[300:], None, 250)])                   # 550 slots > 512: the cache doubles
    assert lm.lm.max_len == 1024 and lm.width == 550
    assert torch.allclose(lg[0, :250], LeanLM(m).forward(torch.tensor(ids))[300:], atol=1e-4)


BACKENDS = {"auto": LeanBatchLM, "hf": BatchCausalLM}


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("method,params", [("prompt-lookup", {}), ("tree-dynamic", dict(budget=8, width=3))])
def test_compacting_every_round_changes_nothing(method, params, backend, target, draft, prompts, alone, monkeypatch):
    import speclab.models.hf as hf
    import speclab.models.lean.batch as lean_batch
    monkeypatch.setattr(hf, "COMPACT_AT", 0)
    monkeypatch.setattr(lean_batch, "COMPACT_AT", 0)           # compact whenever 64 slots are hidden
    calls = []
    cls = BACKENDS[backend]
    real = cls.compact
    monkeypatch.setattr(cls, "compact", lambda self: calls.append(1) or real(self))
    rs = speclab.generate(target, prompts[:3], method, draft=draft, max_new_tokens=NEW, record=None,
                          backend=backend, **params)
    assert [r.ids for r in rs] == alone[:3] and len(calls) > 3


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_eos_in_one_lane_leaves_the_batch_early(backend, target, draft, prompts, alone, monkeypatch):
    """Make the 6th token of lane 1 the end of text: lane 1 stops there, its rows leave the forward,
    and the others go on to max_new_tokens, each still equal to decoding it alone."""
    eos = alone[1][5]
    assert eos not in alone[1][:5]
    tok = copy.deepcopy(target[1])
    tok.eos_token = tok.convert_ids_to_tokens(eos)
    tgt = (target[0], tok)
    ps = prompts[:3]
    ref = [speclab.generate(tgt, p, "ar", max_new_tokens=NEW, record=None).ids for p in ps]
    assert len(ref[1]) == 6 and any(len(r) == NEW for r in ref)
    rows = []
    cls = BACKENDS[backend]
    real = cls.forward
    monkeypatch.setattr(cls, "forward", lambda self, r, k=None: rows.append(len(r)) or real(self, r, k))
    rs = speclab.generate(tgt, ps, "draft-model", draft=draft, max_new_tokens=NEW, backend=backend)
    assert [r.ids for r in rs] == ref
    lanes_rounds = [len(r.trace.rounds) for r in rs]
    assert len(rows) == max(lanes_rounds)                       # one forward per round for the batch
    assert rows == [sum(n > i for n in lanes_rounds) for i in range(len(rows))]   # finished lanes left
    assert rs[1].trace.totals.target_forwards == lanes_rounds[1] < len(rows)
    assert rs[1].trace.output_ids[-1] == eos


def test_traces_replay_and_count(target, draft, prompts, tmp_path, monkeypatch):
    from speclab.models.lean.forward import LeanLM
    calls = {"draft": 0}
    real = LeanLM.forward

    def counted(self, *a, **kw):
        calls["draft"] += self.name == "draft"
        return real(self, *a, **kw)
    monkeypatch.setattr(LeanLM, "forward", counted)
    rs = speclab.generate(target, prompts[:3], "draft-model", draft=draft, max_new_tokens=NEW, record="full", k=3)
    assert sum(r.trace.totals.draft_forwards for r in rs) == calls["draft"]
    for b, r in enumerate(rs):
        t = Trace.load(r.trace.save(tmp_path / f"lane{b}.json"))
        assert replay(t) == r.ids == t.output_ids
        assert t.params["lane"] == b and t.params["batch_size"] == 3 and t.sampling.seed == b
        assert t.totals.target_forwards == len(t.rounds)
        assert t.totals.new_tokens == sum(rd.kept for rd in t.rounds) == len(r.ids)
        assert t.totals.accepted == sum(len(rd.accepted) for rd in t.rounds)
        assert t.totals.wall_s == rs[0].trace.totals.wall_s      # the batch's wall time
        assert any(rd.nodes and rd.nodes[0].p_topk for rd in t.rounds)


@pytest.mark.parametrize("method", ["draft-model", "tree-dynamic"])
def test_sampled_lanes_equal_their_seed_alone_at_every_record_level(method, target, draft, prompts):
    """Lane i draws from its own generator seeded seed + i: alone with that seed, the same text."""
    ps = prompts[:3]
    kw = dict(draft=draft, max_new_tokens=16, temperature=0.9, top_k=50)
    outs = [[r.ids for r in speclab.generate(target, ps, method, seed=7, record=level, **kw)]
            for level in (None, "full")]
    assert outs[0] == outs[1]
    assert outs[0] == [speclab.generate(target, p, method, seed=7 + i, record=None, **kw).ids
                       for i, p in enumerate(ps)]
    seeds = [3, 3, 11]
    rs = speclab.generate(target, ps, method, seed=seeds, record=None, **kw)
    assert [r.trace.sampling.seed for r in rs] == seeds


def test_first_sampled_token_of_each_lane_follows_its_target_distribution(target, draft):
    """Two prompts of different lengths, many lanes each (every lane its own seed): per prompt, the
    first token over its lanes is distributed as the target's p there (spec-sampling with a draft)."""
    model, tok = target
    ps = ["    def __repr__(self):\n        return", "import os\n\ndef main("]
    sampler = Sampler(1.0, top_k=8)
    n, lanes = 600, 150
    for j, prompt in enumerate(ps):
        with torch.no_grad():
            p = warp(model(input_ids=torch.tensor([_ids(target, prompt)])).logits[0, -1], sampler)
        counts = torch.zeros_like(p)
        for start in range(0, n, lanes):
            rs = speclab.generate(target, [prompt] * lanes, "draft-model", draft=draft, max_new_tokens=1, k=2,
                                  temperature=1.0, top_k=8, seed=[1000 * j + start + i for i in range(lanes)],
                                  record=None)
            for r in rs:
                counts[r.ids[0]] += 1
        keep = p > 0
        assert counts[~keep].sum() == 0
        exp = p[keep].double() / p[keep].double().sum() * n
        assert chisquare(counts[keep].double().numpy(), exp.numpy()).pvalue > 1e-3, prompt


@pytest.mark.parametrize("prompt,method,kw,words", [
    ([], "ar", {}, "empty prompt: give a prompt (text or token ids), or a non-empty list"),
    (["def f():", 5], "ar", {}, "prompt 1 is a int"),
    (["def f():", "   "], "ar", {}, "prompt 1 of the batch: empty prompt"),
    (["def f():"], "layer-skip", {}, "does not run in a batch yet: batches support " + ", ".join(batch_methods())),
    (["def f():"], "eagle", {}, "method 'eagle' does not run in a batch yet"),
    (["a", "b"], "ar", dict(seed=[1]), "one integer (prompt i gets seed + i) or a list of 2 integers"),
])
def test_bad_batches_are_one_line_errors(target, prompt, method, kw, words):
    with pytest.raises(ValueError, match=re.escape(words)) as e:
        speclab.generate(target, prompt, method, max_new_tokens=4, **kw)
    assert "\n" not in str(e.value)


def test_a_drafter_instance_or_another_engine_cannot_batch(target):
    from speclab.decoding.speculative import Drafter
    with pytest.raises(ValueError, match="pass a method name, not a Drafter instance"):
        speclab.generate(target, ["a", "b"], Drafter(), max_new_tokens=4)
    with pytest.raises(ValueError, match="takes one prompt at a time"):
        speclab.run("numwords-dat", ["12", "13"], "dag-viterbi")


def test_cli_batch_prompt_file(capsys, tmp_path, prompts, alone):
    from speclab.cli import main
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": p}) for p in prompts[:3]) + "\n\n")
    code = main(["run", "--prompt-file", str(f), "--batch-size", "2", "--method", "prompt-lookup",
                 "--max-new-tokens", str(NEW), "--json", "--trace", str(tmp_path / "t.json")])
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 0 and [r["ids"] for r in rows] == alone[:3]
    assert [(r["batch_size"], r["lane"]) for r in rows] == [(2, 0), (2, 1), (1, 0)]
    assert replay(Trace.load(tmp_path / "t.2.json")) == alone[2]
    g = tmp_path / "plain.txt"
    g.write_text("def f(x):\nclass A:\n")
    code = main(["run", "--prompt-file", str(g), "--batch-size", "4", "--max-new-tokens", "4", "--color", "never"])
    out = capsys.readouterr().out
    assert code == 0 and "--- prompt 1 (lane 1 of 2)" in out and "class A:" in out and "tokens/s" in out


@pytest.mark.parametrize("args,words", [
    (["--batch-size", "0"], "--batch-size must be an integer >= 1"),
    (["--batch-size", "2", "--method", "medusa"], "does not run in a batch yet"),
    (["--batch-size", "2", "--method", "dag-viterbi"], "takes one prompt at a time"),
])
def test_cli_batch_errors(capsys, tmp_path, args, words):
    from speclab.cli import main
    f = tmp_path / "p.txt"
    f.write_text("def f(x):\n")
    code = main(["run", "--prompt-file", str(f), "--max-new-tokens", "4", *args])
    err = capsys.readouterr().err
    assert code == 2 and words in err and err.count("\n") == 1


def test_bench_batch_size(target, draft):
    from speclab.bench.runner import bench, parse_methods
    res = bench(target, draft, parse_methods("ar,draft-model[k=3]"), "code-mixed", max_new_tokens=8, limit=3,
                record=None, progress=False, batch_size=2)
    assert res["batch_size"] == 2 and [r["batch_size"] for r in res["rows"]] == [2, 2]
    for r in res["rows"]:
        assert r["identical_rate"] == 1 and r["new_tokens"] == 24 and r["latency_s"] > 0
