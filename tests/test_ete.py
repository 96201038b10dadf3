"""ETE (dllm-ete) across blocks: on digits-dllm, a whole-canvas dLLM of the toy zoo decoded in blocks
of 2, its threshold commits land in later blocks and it needs fewer rounds than dllm-threshold on the
same prompts; its records (information per round, explored slots and their entropy, commits outside
the block, nats so far) agree with the trace's own confidences and output; on a block-causal model
every commit stays in its block; the information meter is drawn for its traces."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

import speclab
from speclab.decoding.diffusion import denoise
from speclab.decoding.dllm_adapt import ETE
from speclab.figures.ete import ete_figure, rounds
from speclab.figures.views import RECORD_FIGURES
from speclab.models.dllm import make_denoiser
from speclab.records import EteRound
from speclab.train import digits
from speclab.trace import Trace, replay

sys.path.insert(0, str(Path(__file__).parent))
from test_block_dllm import B, tiny  # noqa: E402  (a block-diffusion Llama from a config)


@pytest.fixture(scope="module")
def dig():
    return speclab.models.zoo.load_shared("digits-dllm")


@pytest.fixture(scope="module")
def prompts():
    return [p["prompt"] for p in digits.eval_prompts(3)]          # 3 ADD + 3 SUM, held out


def run(dig, prompt, method, **kw):
    return speclab.run(dig, prompt, method, gen_length=digits.ANSWER_LEN, block_length=2, record="full", **kw)


def test_cross_block_ete_commits_in_later_blocks_and_needs_fewer_rounds_than_threshold(dig, prompts):
    ete = [run(dig, p, "dllm-ete") for p in prompts]
    thr = [run(dig, p, "dllm-threshold") for p in prompts]
    outside = [q for r in ete for s in r.trace.denoise for q in s.committed if not s.block[0] <= q < s.block[1]]
    assert outside and all(q >= 2 for q in outside)             # later blocks only: earlier ones are written
    assert sum(r.trace.totals.target_forwards for r in ete) < sum(r.trace.totals.target_forwards for r in thr)
    # held to its block, it commits nothing outside it
    held = [run(dig, p, "dllm-ete", cross_block=False) for p in prompts[:2]]
    assert all(s.block[0] <= q < s.block[1] for r in held for s in r.trace.denoise for q in s.committed)
    assert all(s.info["outside_block"] == 0 for r in held for s in r.trace.denoise)


def test_the_rounds_records_agree_with_the_trace(dig, prompts, tmp_path):
    r = run(dig, prompts[4], "dllm-ete", budget=2.0)
    t = Trace.load(r.trace.save(tmp_path / "t.json"))
    assert replay(t) == r.ids
    total = 0.0
    for s in t.denoise:
        rec = EteRound.of(s)
        conf = dict(zip(s.masked, s.conf))
        ent = dict(zip(s.masked, s.info["entropy"]))                # record="full": every masked slot's entropy
        nats = lambda ps: sum(-math.log(max(conf[p], 1e-30)) for p in ps)
        assert rec.information == pytest.approx(nats(s.committed), abs=2e-3)
        assert rec.explore_information == pytest.approx(nats(rec.explored), abs=2e-3)
        assert rec.explored_entropy == pytest.approx([ent[p] for p in rec.explored], abs=2e-3)
        assert rec.outside_block == sum(1 for p in s.committed if not s.block[0] <= p < s.block[1])
        total += rec.information
        assert rec.information_total == pytest.approx(total, abs=1e-2)
        assert set(rec.explored) <= set(s.committed)
    assert sum(len(s.info["explored"]) for s in t.denoise) > 0
    fig = ete_figure(t, 0)
    assert len(rounds(t)) == len(t.denoise) and "information meter" in RECORD_FIGURES
    assert fig.data[0].y[0] + fig.data[1].y[0] == pytest.approx(t.denoise[0].info["information"], abs=1e-3)


def test_on_a_block_causal_model_cross_block_commits_stay_in_the_block():
    """tiny() is block-causal with B = 4: the later blocks are unseen, so nothing lands there."""
    out, steps, _ = denoise(make_denoiser(tiny()), [1, 2, 3, 4, 5], ETE(threshold=0.5, budget=3.0), 12, B)
    assert all(s.block[0] <= p < s.block[1] for s in steps for p in s.committed)
    assert all(s.info["outside_block"] == 0 for s in steps)
