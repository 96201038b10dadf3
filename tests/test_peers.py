"""transformers' own decoding as a peer: the static-cache peer (hf-static) and its warm-up rule.
On a CPU transformers does not compile, so hf-static runs its static cache eagerly: the same
generate() call, cache sizing and timing code a CUDA run takes. Speed is not asserted here."""
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import speclab
from speclab.bench.peers import run_peer, settled, warm_static
from speclab.cli import main
from speclab.models.zoo import ZOO_DIR, tokenizer_dir


@pytest.fixture(scope="module")
def code_target():
    """A private fp32 copy (transformers records the static cache's length on the model)."""
    path = ZOO_DIR / "code-target"
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(tokenizer_dir(path))


def test_static_cache_peer_decodes_as_greedy_with_one_cache_for_every_prompt(code_target):
    model, tok = code_target
    prompts = [tok("def add(a, b):\n    return", add_special_tokens=False)["input_ids"],
               tok("import os\nimport sys\n\n\ndef main(argv):\n    path = os.path.join(", add_special_tokens=False)["input_ids"]]
    cache_len = max(map(len, prompts)) + 20
    for ids in prompts:
        static = run_peer("hf-static", model, tok, ids, 20, max_cache_len=cache_len)
        greedy = run_peer("hf-greedy", model, tok, ids, 20)
        ar = speclab.run((model, tok), ids, "ar", max_new_tokens=20, dtype=torch.float32).ids
        assert static["ids"] == greedy["ids"] == ar and len(ar) > 0
        # one cache length for both prompts: a compiled step would serve both without recompiling
        assert static["cache_len"] == cache_len == model._previous_max_cache_length
        assert static["target_forwards"] == greedy["target_forwards"] and static["wall_s"] > 0
        assert "warmup_s" not in static                  # nothing compiles on a CPU: nothing to warm
    # a shorter request reuses the longer cache transformers already holds
    assert run_peer("hf-static", model, tok, prompts[0], 4)["cache_len"] == cache_len


def test_static_cache_peer_refuses_a_cache_shorter_than_the_request(code_target):
    model, tok = code_target
    with pytest.raises(ValueError, match="max_cache_len 8 is shorter than the prompt"):
        run_peer("hf-static", model, tok, [5, 6, 7, 8], 12, max_cache_len=8)


def test_warm_up_settles_when_two_calls_agree():
    assert not settled([9.0, 2.0])                       # compile and capture come first
    assert not settled([9.0, 3.0, 2.0])
    assert settled([9.0, 2.0, 2.05]) and not settled([9.0, 2.0, 2.2])
    times = iter([9.0, 3.0, 2.0, 2.02, 2.0])
    assert warm_static(lambda: next(times)) == [9.0, 3.0, 2.0, 2.02]
    grow = iter(range(1, 100))
    assert len(warm_static(lambda: float(2 ** next(grow)), max_calls=6)) == 6   # never settles: stops at max


def test_bench_static_peer_row_and_the_bandwidth_it_stands_beside(tmp_path):
    out = tmp_path / "b.json"
    code = main(["bench", "--target", "code-target", "--limit", "2", "--max-new-tokens", "12", "--dtype", "fp32",
                 "--methods", "ar,hf-static,hf-greedy", "--prompts", "code-complete", "--json", str(out)])
    assert code == 0
    res = json.loads(out.read_text())
    rows = {r["method"]: r for r in res["rows"]}
    assert set(rows) == {"ar", "hf-static", "hf-greedy"}
    assert rows["hf-static"]["identical_rate"] == 1.0 and rows["hf-static"]["tau"] == 1.0
    assert rows["hf-static"]["target_forwards"] == rows["hf-greedy"]["target_forwards"]
    assert res["bandwidth"]["bandwidth_kind"] == "streaming read"      # a CPU: no device copy
