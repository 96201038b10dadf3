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
    assert set(rows) == {"ar", "oracle[k=2]", "oracle[k=4]", "oracle[k=8]", "prompt-lookup", "ar[batch=8]",
                         "ar[graphs=off]", "ar[lean eager]", "hf-greedy", "hf-static", "eagle", "eagle3"}
    for label, r in rows.items():
        assert "error" not in r, (label, r)
        assert r["identical_to_ar"], label          # the t -> t+1 head leaves no near-tie to round
        assert r["tokens_per_s"] > 0 and r["new_tokens"] == 8
    assert rows["ar"]["speedup_vs_ar"] == 1.0 and rows["oracle[k=4]"]["tau"] > 2
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
