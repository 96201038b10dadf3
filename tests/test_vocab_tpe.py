"""`speclab train vocab`: a draft's vocabulary size searched with optuna's TPE under a minimum
coverage of the target's answers (speclab.train.vocab). On the toy zoo (code-target's answers,
code-draft's FLOPs): the chosen size meets the floor, a tighter floor never gives a smaller
vocabulary, the search trims (it does not just keep everything); a missing optuna is a one-line
error; --save cuts a trimmed head's ids."""
from __future__ import annotations

import json
import sys

import pytest
import torch

import speclab
from speclab.cli import main as speclab_main
from speclab.train import vocab
from speclab.train.vocab import (flops_latency, prefix_coverage, save_trimmed, search_vocab_size, select_head_ids,
                                 token_ranks)

pytest.importorskip("optuna")


@pytest.fixture(scope="module")
def ranks():
    target = speclab.models.zoo.load_shared("code-target")
    toks = vocab.answer_tokens(target, "code-complete", 3, 32)
    V = target[0].config.vocab_size
    return token_ranks(toks, select_head_ids(toks, V, [], V, fill=True), V), toks


def test_the_chosen_vocabulary_meets_its_floor_and_a_tighter_floor_keeps_more(ranks):
    r, toks = ranks
    lat = flops_latency(speclab.models.zoo.load_shared("code-draft")[0].config)
    loose = search_vocab_size(r, lat, 0.6, 1, 256, trials=20)
    tight = search_vocab_size(r, lat, 0.95, 1, 256, trials=20)
    for res, floor in ((loose, 0.6), (tight, 0.95)):
        assert res["coverage"] >= floor and res["coverage"] == pytest.approx(prefix_coverage(r, res["size"]), abs=1e-5)
        assert res["size"] < 256 and len(res["trials"]) == 20 and res["trials"][0]["size"] == 256
        assert res["utility"] == max(t["utility"] for t in res["trials"] if t["feasible"])
    assert tight["size"] >= loose["size"] and tight["latency"] >= loose["latency"]
    # coverage is the share of the answers' tokens among the kept ids, counted directly
    keep = select_head_ids(toks, 8192, [], 8192, fill=True)[:tight["size"]]
    assert tight["coverage"] == pytest.approx(float(torch.isin(toks, keep).float().mean()), abs=1e-5)
    with pytest.raises(ValueError, match="lower --min-coverage"):
        search_vocab_size(r, lat, 1.0, 1, 2, trials=2)


def test_the_command_writes_its_choice(tmp_path):
    out = tmp_path / "v.json"
    assert speclab_main(["train", "vocab", "--draft", "code-draft", "--target", "code-target", "--prompts",
                         "code-complete", "--limit", "2", "--max-new-tokens", "24", "--trials", "6",
                         "--n-min", "4", "--min-coverage", "0.9", "--json", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["coverage"] >= 0.9 and 4 <= res["size"] <= 8192 and res["latency_model"]["unit"] == "GFLOPs"


def test_without_optuna_the_search_says_how_to_install_it(ranks, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)
    with pytest.raises(ImportError, match=r"pip install 'speclab\[train\]'"):
        search_vocab_size(ranks[0], flops_latency(speclab.models.zoo.load_shared("code-draft")[0].config),
                          0.9, 1, 64)


def test_save_cuts_a_trimmed_heads_ids(tmp_path):
    from safetensors.torch import load_file
    src = speclab.models.zoo.resolve("smollm2-draft")
    save_trimmed(src, tmp_path / "d", 1000)
    ids, full = load_file(str(tmp_path / "d" / "model.safetensors"))["head_ids"], load_file(f"{src}/model.safetensors")
    assert torch.equal(ids, full["head_ids"][:1000]) and (tmp_path / "d" / "config.json").exists()


def test_measured_latency_times_the_drafts_forward_at_each_size():
    from speclab.train.vocab import measured_latency
    draft = speclab.models.zoo.load_shared("code-draft")[0]
    lat = measured_latency(draft, draft.lm_head.weight, [64, 1024, 8192], context=8, repeats=2)
    times = [float(t) for t in lat.how.split(": ")[1].strip("[] ms").split(", ")]
    assert lat.unit == "ms" and len(times) == 3 and min(times) > 0 and lat.per_id >= 0
    assert lat(8192) == pytest.approx(lat.fixed + 8192 * lat.per_id)
