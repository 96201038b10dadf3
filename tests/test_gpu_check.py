"""scripts/gpu_check.py --smoke: the GPU check's whole code path on a CPU, with tiny shapes.

The numbers are meaningless here; what is pinned is that every row runs, its output is held to
`ar`, and the JSON carries the fields a GPU session reads (rows, equality, bandwidth, profile,
goals, the zoo's methods in fp32 and bf16)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_smoke_run_writes_every_row_and_holds_each_to_ar(gpu_check, tmp_path):
    out = tmp_path / "check.json"
    gpu_check.main(["--smoke", "--shapes", "smollm2-135m", "--out", str(out)])
    rep = json.loads(out.read_text())
    assert rep["smoke"] and rep["device"] == "cpu" and rep["new_tokens"] == 8
    (shape,) = rep["shapes"]
    rows = shape["rows"]
    assert set(rows) == {"ar", "ar[host-loop]", "oracle[k=2]", "oracle[k=4]", "oracle[k=8]", "prompt-lookup", "ar[batch=8]",
                         "ar[graphs=off]", "ar[lean eager]", "hf-greedy", "hf-static", "eagle", "eagle3"}
    for label, r in rows.items():
        assert "error" not in r, (label, r)
        assert r["identical_to_ar"], label          # the t -> t+1 head leaves no near-tie to round
        assert r["tokens_per_s"] > 0 and r["new_tokens"] == 8
    assert rows["ar"]["speedup_vs_ar"] == 1.0 and rows["oracle[k=4]"]["tau"] > 2
    assert rows["ar"]["prefill_s"] > 0 and rows["ar"]["decode_tokens_per_s"] > 0
    assert rows["ar[graphs=off]"]["backend"] == "StaticLM"
    for m in ("eagle", "eagle3"):               # their targets capture hidden states in the static runner
        assert (rows[m]["backend"], rows[m]["graphs"]) == ("StaticLM", False)
    assert rows["eagle"]["tau"] > 1.5           # the pass-through head drafts what the t -> t+1 target writes
    assert shape["bandwidth"]["limit_tokens_per_s"] > 0
    assert shape["profile_ar"]["rounds"] >= 8 and shape["profile_ar"]["top"]
    assert set(shape["goals"]) >= {"ar_vs_hf_static", "ar_share_of_bandwidth_limit", "oracle4_vs_ar"}
    for dtype in ("float32", "bfloat16"):
        z = rep["zoo"][f"code-target {dtype}"]
        assert z["ran"] >= 8 and z["identical"] == z["ran"], z
        assert {"ar", "draft-model", "prompt-lookup", "tree-dynamic"} <= set(z["methods"])


def test_without_cuda_the_full_check_says_what_to_do(gpu_check):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(SystemExit):
        gpu_check.main([])


def test_a_fatal_row_ends_its_process_only_and_the_shape_resumes(gpu_check, tmp_path):
    """--isolate: a CUDA fault loses the process's context, so each shape runs in a worker; a fatal
    row (simulated here: the CPU has no CUDA fault to give) is rerun alone under
    CUDA_LAUNCH_BLOCKING, and a fresh worker runs the rows after it, still held to ar."""
    out = tmp_path / "check.json"
    gpu_check.main(["--smoke", "--isolate", "on", "--zoo", "none", "--shapes", "smollm2-135m", "--fail-row",
                    "ar[graphs=off]", "--only", "smollm2-135m:ar|ar[graphs=off]|hf-greedy", "--out", str(out)])
    (shape,) = json.loads(out.read_text())["shapes"]
    rows = shape["rows"]
    assert shape["fatal_rows"] == ["ar[graphs=off]"]
    assert rows["ar[graphs=off]"]["error"].startswith("RuntimeError: CUDA error")
    assert rows["ar[graphs=off]"]["where"][-1].startswith("gpu_check.py")
    assert rows["ar[graphs=off]"]["diag_launch_blocking"]["tokens_per_s"] > 0   # the row alone, one run
    assert rows["hf-greedy"]["identical_to_ar"] and rows["ar"]["speedup_vs_ar"] == 1.0
    assert shape["bandwidth"]["limit_tokens_per_s"] > 0 and shape["profile_ar"]["rounds"] >= 8


def test_a_draft_is_built_on_its_base_device():
    """build_draft builds on the CPU and must move its layers to the base's device (a CUDA target's
    EAGLE head once kept them on the CPU). The meta device stands in for a GPU here."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from speclab.models.heads import build_eagle, head_config
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    with torch.device("meta"):
        base = LlamaForCausalLM(cfg)
    head = build_eagle(base, head_config(base.config, "eagle"), torch.arange(64, device="meta"))
    assert {p.device.type for p in head.parameters()} == {"meta"}
