"""`speclab bench` on the real zoo: the JSON rows, peers in the same run, what-if, diffusion
targets, and one-line errors. Speed is not asserted here (that is BENCHMARKS.md's job)."""
import json

import pytest
import torch
from conftest import refused_in_one_line

from speclab.bench.runner import parse_methods
from speclab.bench.whatif import simulate_tau
from speclab.cli import main
from speclab.prompts import PROMPT_DIR

BASE = ["bench", "--target", "code-target", "--limit", "2", "--max-new-tokens", "12"]


def test_bench_rows_peers_and_whatif(capsys, tmp_path):
    out = tmp_path / "b.json"
    code = main(BASE + ["--draft", "code-draft", "--methods", "draft-model[k=3],hf-greedy,ar,hf-assisted,prompt-lookup,tree-dynamic[budget=4],oracle[k=3]",
                        "--prompts", "code-complete", "--whatif", "--json", str(out), "--html", str(tmp_path / "b.html")])
    assert code == 0 and "| draft-model[k=3] |" in capsys.readouterr().out
    res = json.loads(out.read_text())
    rows = {r["method"]: r for r in res["rows"]}
    assert set(rows) == {"ar", "draft-model[k=3]", "hf-greedy", "hf-assisted", "prompt-lookup", "tree-dynamic[budget=4]",
                         "oracle[k=3]"}
    assert res["rows"][0]["method"] == "ar"                     # the baseline runs first: the oracle drafts its output
    for r in rows.values():
        assert {"method", "prompt_set", "wall_s", "tokens_per_s", "speedup_vs_ar", "tau", "alpha",
                "identical_rate"} <= set(r)
        assert r["identical_rate"] == 1.0, r["method"]          # every greedy method and peer is lossless
    assert rows["ar"]["tau"] == 1.0 and rows["ar"]["speedup_vs_ar"] == 1.0
    dm = rows["draft-model[k=3]"]
    assert 1.0 <= dm["tau"] <= 4.0 and 0.0 <= dm["alpha"] <= 1.0 and dm["draft_forwards"] > 0
    assert len(dm["accept_unconditional"]) >= 3 and dm["efficiency"] > 0
    assert rows["oracle[k=3]"]["alpha"] == 1.0 and rows["oracle[k=3]"]["tau"] > dm["tau"]   # a perfect draft
    assert [w["k"] for w in res["whatif"] if w["threshold"] is None][:3] == [1, 2, 3]
    assert (tmp_path / "b.html").read_text().count("plotly") > 0
    # a tree method ran: the verify forward's cost by row count, in one-token forwards
    assert list(res["verify_cost"]) == ["1", "2", "4", "6", "7", "8", "12", "16", "17", "24"]
    assert all(c > 0 for c in res["verify_cost"].values())
    # ar against the bandwidth limit: the bandwidth sampled once after each of ar's prompts
    b = res["bandwidth"]["per_set"]["code-complete"]
    assert b["samples"] == 2 and b["bandwidth_range_gb_s"][0] <= b["bandwidth_gb_s"] <= b["bandwidth_range_gb_s"][1]
    assert b["ar_tokens_per_s"] == rows["ar"]["tokens_per_s"]
    assert b["ar_share_of_limit"] == pytest.approx(b["ar_tokens_per_s"] / b["limit_tokens_per_s"], abs=2e-3)
    # and after the prompts' prefill (each run's first round): the decoding's own rate, a faster one
    assert 0 < rows["ar"]["prefill_s"] < rows["ar"]["wall_s"] and 0 < b["ar_prefill_share"] < 1
    assert b["ar_decode_tokens_per_s"] == rows["ar"]["decode_tokens_per_s"] > rows["ar"]["tokens_per_s"] * 0.95
    assert b["ar_decode_share_of_limit"] == pytest.approx(b["ar_decode_tokens_per_s"] / b["limit_tokens_per_s"], abs=2e-3)
    # and prompt by prompt: each ar run against the sample taken right after it
    p = b["ar_share_paired"]
    assert p["prompts"] == 2 and 0 < p["min"] <= p["median"] <= p["max"]


def prompt_file(tmp_path, n: int):
    """The first n prompts of code-complete as a JSONL file of the user's own, by absolute path."""
    path = tmp_path / "mine.jsonl"
    path.write_text("\n".join((PROMPT_DIR / "code-complete.jsonl").read_text().splitlines()[:n]) + "\n")
    return str(path.absolute())


def test_a_prompt_file_is_named_by_its_stem_in_traces_and_json(capsys, tmp_path):
    """A JSONL file given by absolute path: its traces go to DIR/<stem>/<method>/<i>.json (not to DIR
    joined with that path), and the rows, the table and the JSON call the set by its stem."""
    out, traces = tmp_path / "b.json", tmp_path / "traces"
    code = main(["bench", "--target", "code-target", "--methods", "ar,prompt-lookup", "--max-new-tokens", "4",
                 "--prompts", prompt_file(tmp_path, 2), "--traces", str(traces), "--json", str(out)])
    assert code == 0
    saved = sorted(p.relative_to(traces).as_posix() for p in traces.rglob("*.json"))
    assert saved == ["mine/ar/000.json", "mine/ar/001.json", "mine/prompt-lookup/000.json",
                     "mine/prompt-lookup/001.json"]
    res = json.loads(out.read_text())
    assert res["prompt_set"] == "mine" and {r["prompt_set"] for r in res["rows"]} == {"mine"}
    assert list(res["bandwidth"]["per_set"]) == ["mine"] and "traces" not in res
    assert "| ar | mine |" in capsys.readouterr().out


def test_the_results_are_saved_before_what_can_fail_after_them(capsys, tmp_path, monkeypatch):
    """Traces, reports and plots come after the JSON: their failure says where the results are."""
    import speclab.bench.cli

    def fail(*_):
        raise NotADirectoryError("cannot write the traces")

    monkeypatch.setattr(speclab.bench.cli, "save_traces", fail)
    out = tmp_path / "b.json"
    with pytest.raises(NotADirectoryError):
        main(["bench", "--target", "code-target", "--methods", "ar", "--max-new-tokens", "2",
              "--prompts", prompt_file(tmp_path, 1), "--traces", str(tmp_path / "t"), "--json", str(out)])
    assert f"the results are saved in {out}" in capsys.readouterr().err
    assert [r["method"] for r in json.loads(out.read_text())["rows"]] == ["ar"]


def test_paired_share_pairs_each_run_with_its_sample():
    """A run at 100 tok/s of 250 MB a token reads 25 GB/s: all of a 25 GB/s stream, half of 50."""
    from speclab.bench.bandwidth import paired_share
    p = paired_share([(100, 50), (100, 25), (200, 100)], 250_000_000)
    assert (p["min"], p["median"], p["max"], p["prompts"]) == (0.5, 0.5, 1.0, 3)


def test_probe_reads_the_models_own_packed_weights():
    """Beside the 512 MiB read, the probe reads the very matrices a bf16 decode step reads (built
    and cached by the lean forward), from wherever they live; the limit and ar's share follow."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from speclab.bench.bandwidth import BandwidthProbe, bandwidth_limit
    from speclab.models import kernels
    from speclab.models.lean.forward import LeanLM
    from speclab.models.lean.weights import packed_matrices
    if not kernels.available("cpu", torch.bfloat16):
        pytest.skip("needs speclab's bf16 kernel (an x86 CPU with AVX2)")
    model = LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).to(torch.bfloat16)
    assert packed_matrices(model) == []                     # nothing built yet: nothing to read
    LeanLM(model).forward(torch.tensor([1, 2, 3]))
    own = packed_matrices(model)
    assert len(own) == 2 * 4 + 1                           # qkv, o, gate|up, down a layer; the head
    assert sum(t.numel() for t in own) == sum(p.numel() for n, p in model.named_parameters()
                                              if n.endswith("proj.weight") or n == "lm_head.weight")
    probe = BandwidthProbe(mib_stream=8, mib_gemv=4, model=model)
    probe.sample(2, ar_tokens_per_s=50.0)
    m = probe.summary()
    assert m["own"]["samples"] == 2 and m["own"]["median"] > 0 and len(m["own_pairs"]) == 1
    b = bandwidth_limit(model, m)
    assert b["own_limit_tokens_per_s"] > 0 and b["own_range_gb_s"][0] <= b["own_read_gb_s"] <= b["own_range_gb_s"][1]


def test_every_shipped_prompt_set_loads_and_the_long_edits_keep_their_file():
    """code-edit-long: each item is a held-out function with at least 2,500 characters of its module
    before it, then the near-duplicate's first line (the original def line is in the context)."""
    from speclab.prompts import SETS, load_prompts
    assert all(load_prompts(name) for name in SETS)
    long = load_prompts("code-edit-long")
    assert len(long) == 20 and len(set(long)) == 20
    for row in long:
        context, last = row.rsplit("\n", 1)
        assert last.lstrip().startswith("def copy_of_") and last.endswith(":")
        assert last.replace("def copy_of_", "def ", 1) + "\n" in context
        assert context.index(last.replace("def copy_of_", "def ", 1)) >= 2500


def test_whatif_at_the_recorded_k_reproduces_the_run():
    """Replaying a trace at the k it ran with must give back its own tau."""
    import speclab
    from speclab.bench.whatif import position_outcomes
    from speclab.prompts import load_prompts
    r = speclab.generate("code-target", load_prompts("code-complete", 1)[0], "draft-model", draft="code-draft",
                         k=3, max_new_tokens=40, record="full")
    sim = simulate_tau(position_outcomes(r.trace), k=3)
    assert sim["tau"] == pytest.approx(r.trace.totals.tau, abs=0.15)


def test_bench_a_diffusion_target(capsys, tmp_path):
    out = tmp_path / "d.json"
    code = main(["bench", "--target", "code-dllm", "--limit", "2", "--max-new-tokens", "16", "--prompts",
                 "code-complete", "--methods", "dllm-threshold[threshold=0.5],dllm-lowconf[steps=8]",
                 "--json", str(out)])
    assert code == 0
    res = json.loads(out.read_text())
    rows = {r["method"]: r for r in res["rows"]}
    assert res["baseline"] == "dllm-lowconf" and rows["dllm-lowconf"]["identical_rate"] == 1.0
    assert rows["dllm-lowconf[steps=8]"]["tau"] >= 1.0 and rows["dllm-threshold[threshold=0.5]"]["tau"] >= 1.0


@pytest.mark.parametrize("args,msg", [
    (["--methods", "ar,nonsense"], "unknown method 'nonsense'"),
    (["--methods", "draft-model[k=3"], "bad method spec"),
    (["--methods", "ar", "--repeats", "0"], "--repeats"),
    (["--methods", "ar", "--prompts", "no-such-set"], "no-such-set"),
    (["--methods", "ar", "--prompts", "code-complete,no-such-set"], "no-such-set"),   # before the first set runs
    (["--methods", "ar", "--prompts", f"code-edit,{PROMPT_DIR / 'code-edit.jsonl'}"],
     "two prompt sets are named 'code-edit'"),
    (["--methods", "ar", "--json", "/no/such/folder/b.json"], "--json /no/such/folder/b.json: no folder"),
    # what the Engine rows say: a method whose engine decodes another kind, a target no engine benches
    (["--methods", "ar,dllm-threshold"], "code-target is not a masked-diffusion LM (a causal LM): dllm-threshold"),
    (["--methods", "ar,prompt-lookup[kk=3]"], "method 'prompt-lookup' does not take ['kk']"),
    (["--target", "numwords-dat", "--methods", "dag-greedy"], "the bench has no baseline for a DA-Transformer"),
])
def test_bench_errors(capsys, no_model_loads, args, msg):
    """One line each, before any model loads: a typo never costs a run's minutes."""
    refused_in_one_line(capsys, BASE + args, msg)


def test_parse_methods_keeps_nested_lists():
    s = parse_methods("ar,tree-static[paths=[[0],[1],[0,0]]],draft-model[k=6;threshold=0.5]")
    assert [x.method for x in s] == ["ar", "tree-static", "draft-model"]
    assert s[1].params["paths"] == [[0], [1], [0, 0]] and s[2].params == {"k": 6, "threshold": 0.5}
