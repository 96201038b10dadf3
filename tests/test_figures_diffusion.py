"""Diffusion views: the canvas step view, the decoding-order map and the confidence bands, on traces
of real masked-diffusion runs, and the same traces through the player, the export and the dashboard.

The model is the zoo's digits-dllm once it is there; until then a tiny Llama built from a config
and marked as a diffusion LM (random weights: real forwards, low confidence, forced commits).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

import speclab
from speclab import figures as F
from speclab.export import animated, to_html
from speclab.figures import colors
from speclab.figures.diffusion import label, masked_color, prob_threshold
from speclab.trace import Round, Totals, Trace, TraceError

torch.set_num_threads(1)
ZOO = Path(speclab.__file__).parent / "zoo" / "digits-dllm"
CELLS, BARS, THRESHOLD = 1, 3, 4          # canvas_dict's documented trace order


@pytest.fixture(scope="module")
def dllm():
    """(model, tokenizer): digits-dllm when fully written, else a tiny random one of the same kind."""
    if all((ZOO / f).exists() for f in ("config.json", "model.safetensors", "tokenizer.json")):
        from speclab.models.zoo import load_shared
        return load_shared("digits-dllm", "cpu")
    from transformers import LlamaConfig, LlamaForCausalLM
    from speclab.models.dllm import mark_dllm
    from speclab.train import digits
    tok = digits.build_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(digits.VOCAB), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32,
                         bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return LlamaForCausalLM(mark_dllm(config, tok.mask_token_id, shift=False)).eval(), tok


@pytest.fixture(scope="module")
def runs(dllm):
    """A probability threshold (line drawn), two blocks of two commits per step, a logit-gap policy."""
    run = lambda method, **kw: speclab.run(dllm, "SUM 27=", method, gen_length=8, **kw).trace
    return dict(
        threshold=run("dllm-threshold", threshold=0.5, record="full"),
        blocks=run("dllm-lowconf", block_length=4, steps=4, record="light"),
        prophet=run("dllm-prophet", late=0.5, record="light"),
    )


def state_of(s, p) -> str:
    return "now" if p in s.committed else "masked" if p in s.masked else "earlier"


def test_step_figure_for_every_step(runs):
    for tr in runs.values():
        n = F.n_steps(tr)
        assert n == len(tr.denoise) > 0
        count = None
        for i, s in enumerate(tr.denoise):
            fig = F.step_figure(tr, i)
            count = count or len(fig.data)
            assert len(fig.data) == count                  # fixed trace count: players update in place
            assert fig.layout.meta["step"] == i and fig.layout.title.text.startswith(f"{tr.method}: step {i + 1}/{n}")
            G = tr.params["gen_length"]
            cells = fig.data[CELLS]
            states = [state_of(s, p) for p in range(G)]
            prop = dict(zip(s.masked, zip(s.top1, s.conf)))
            shown = lambda p: p in prop and (not tr.params.get("block_causal") or s.block[0] <= p < s.block[1])
            # a masked slot shows its proposal and confidence in place, its grey deepening with the confidence
            assert list(cells.marker.color) == [masked_color({p: (0, prop[p][1])}, p) if st == "masked" and shown(p)
                                                else colors.CANVAS[st] for p, st in enumerate(states)]
            assert list(cells.text) == [
                (f"<span style='color:#555555'><i>{label(tr, prop[p][0])}</i><br>{prop[p][1]:.2f}</span>"
                 if shown(p) else "") if st == "masked" else label(tr, s.tokens[p]) for p, st in enumerate(states)]
            bars = fig.data[BARS]
            assert list(bars.x) == s.masked and list(bars.y) == s.conf
            assert list(bars.text) == [label(tr, t) for t in s.top1]
            lo, hi = s.block
            assert min(fig.data[0].x) == lo - 0.5 and max(fig.data[0].x) == hi - 0.5
            thr = prob_threshold(tr, s)
            assert list(fig.data[THRESHOLD].y) == ([thr, thr] if thr is not None else [None])


def test_masked_colour_runs_from_grey_to_the_bars_blue_with_confidence():
    assert masked_color({0: (5, 0.0, 0.0)}, 0) == colors.CANVAS["masked"]
    assert masked_color({0: (5, 1.0, 0.0)}, 0) == colors.PROPOSAL["block"]
    assert masked_color({0: (5, 0.5, 0.0)}, 0) == "#b1cbf1"


def test_threshold_line_only_for_probability_thresholds(runs):
    assert all(prob_threshold(runs["threshold"], s) == 0.5 for s in runs["threshold"].denoise)
    assert all(s.threshold is None for s in runs["blocks"].denoise)
    # Prophet thresholds a logit gap (7.5, 5, 2.5): never drawn on the probability axis
    assert all(s.threshold is not None and prob_threshold(runs["prophet"], s) is None for s in runs["prophet"].denoise)
    # each step says what its threshold measures; the figures read that, not the policy's name
    assert {s.threshold_scale for s in runs["threshold"].denoise} == {"probability"}
    assert {s.threshold_scale for s in runs["prophet"].denoise} == {"logit-gap"}


def test_threshold_scale_is_recorded_and_saved(runs, tmp_path):
    from speclab.trace import THRESHOLD_SCALES, Trace
    tr = runs["threshold"]
    tr.save(tmp_path / "t.json")
    assert [s.threshold_scale for s in Trace.load(tmp_path / "t.json").denoise] == [s.threshold_scale for s in tr.denoise]
    import speclab
    fac = speclab.run("digits-dllm", "SUM 31=", "dllm-threshold", gen_length=8, factor=1.0).trace
    assert {s.threshold_scale for s in fac.denoise} == {"factor"} <= set(THRESHOLD_SCALES)
    assert all(prob_threshold(fac, s) is None for s in fac.denoise)


def test_blocks_are_shaded_where_the_engine_worked(runs):
    tr = runs["blocks"]
    assert [s.block for s in tr.denoise][:2] == [(0, 4), (0, 4)]
    fig = F.step_figure(tr, -1)
    assert (min(fig.data[0].x), max(fig.data[0].x)) == (tr.denoise[-1].block[0] - 0.5, tr.denoise[-1].block[1] - 0.5)


def test_heatmap_marks_exactly_the_committed_positions(runs):
    for tr in runs.values():
        fig = F.decoding_order(tr)
        heat, marks = fig.data[0], fig.data[1]
        want = {(p, i + 1) for i, s in enumerate(tr.denoise) for p in s.committed}     # steps shown from 1
        got = list(zip(marks.x, marks.y))
        assert len(got) == len(want) and set(got) == want
        for i, s in enumerate(tr.denoise):                     # confidence while masked, blank after
            conf = dict(zip(s.masked, s.conf))
            assert list(heat.z[i]) == [conf.get(p) for p in range(tr.params["gen_length"])]
        assert sorted(p for p, _ in got) == sorted(set(p for p, _ in got))   # each position committed once
        cur = F.decoding_order(tr, 1).data[3]
        assert list(cur.y) == [2, 2]


def test_confidence_bands_follow_the_steps(runs):
    for tr in runs.values():
        fig = F.confidence_bands(tr, 0)
        hi, lo, mid, thr, cur, bars = fig.data
        assert list(hi.y) == [max(s.conf) for s in tr.denoise] and list(lo.y) == [min(s.conf) for s in tr.denoise]
        assert list(mid.y) == [statistics.median(s.conf) for s in tr.denoise]
        assert list(bars.y) == [len(s.committed) for s in tr.denoise]
        assert list(thr.y) == [prob_threshold(tr, s) for s in tr.denoise]
        assert list(bars.x) == list(range(1, len(tr.denoise) + 1))
        assert cur.name == "current" and list(cur.x) == [1, 1]
    assert F.run_strip(runs["blocks"], 2).data[4].x == (3, 3)


def test_figures_of_a_saved_trace_equal_the_live_ones(runs, tmp_path):
    tr = runs["threshold"]
    back = Trace.load(tr.save(tmp_path / "d.json"))
    assert F.step_figure(back, 1) == F.step_figure(tr, 1)
    assert F.decoding_order(back) == F.decoding_order(tr)


def test_steps_are_checked_and_engines_kept_apart(runs):
    tr = runs["threshold"]
    with pytest.raises(ValueError, match="out of range"):
        F.step_figure(tr, len(tr.denoise))
    spec = Trace(engine="speculative", method="ar", prompt_ids=[1], output_ids=[2], token_text={1: "a", 2: "b"},
                 totals=Totals(target_forwards=1, new_tokens=1),
                 rounds=[Round(emitted=2, emitted_kind="target", kept=1)])
    for make in (F.decoding_order, F.confidence_bands, F.canvas_figure):
        with pytest.raises(TraceError, match="diffusion"):
            make(spec)
    quiet = Trace(engine="diffusion", method="dllm-threshold", params={"gen_length": 8})   # record=None
    assert F.n_steps(quiet) == 0


def test_export_steps_through_the_denoising_steps(runs, tmp_path):
    tr = runs["blocks"]
    page = to_html(tr, tmp_path / "d.html").read_text(encoding="utf-8")
    i = page.index("Plotly.addFrames(")
    frames = json.JSONDecoder().raw_decode(page[page.index("[", i):])[0]
    assert [f["name"] for f in frames] == [str(k) for k in range(len(tr.denoise))]
    for f, s in zip(frames, tr.denoise):
        bars = f["data"][f["traces"].index(BARS)]
        assert bars["x"] == s.masked and bars["y"] == s.conf
        assert f["layout"]["title"]["text"].startswith(f"{tr.method}: step")
    slider = animated(tr)["layout"]["sliders"][0]
    assert slider["currentvalue"]["prefix"] == "step " and len(slider["steps"]) == len(tr.denoise)
    # step view, bands, order map, and the attention mask (folded) a plot a step
    assert page.count("Plotly.newPlot(") == 3 + len(tr.denoise) and "decoding order" in page
    assert "tokens per forward" in page


def test_player_walks_the_denoising_steps(runs):
    pytest.importorskip("ipywidgets")
    from speclab.widgets import show
    tr = runs["threshold"]
    v = show(tr)
    last = len(tr.denoise) - 1
    assert v.slider.max == last and v.slider.description == "step"
    fig, uids = v.figure, [t.uid for t in v.figure.data]
    v.slider.value = last
    want = [{k: val for k, val in t.to_plotly_json().items() if k != "uid"}
            for t in go.Figure(F.step_dict(tr, last)).data]
    assert [{k: val for k, val in t.to_plotly_json().items() if k != "uid"} for t in fig.data] == want
    assert v.figure is fig and [t.uid for t in fig.data] == uids
    assert list(v.strip.data[4].x) == [last + 1, last + 1]
    assert f"step {last + 1} of {last + 1}" in v.detail.value
    committed = tr.denoise[last].committed
    assert v.detail.value.count("<tr style='font-weight:bold'>") == len(committed)


def test_dashboard_shows_a_diffusion_trace_and_fits_the_form(runs):
    pytest.importorskip("panel")
    from speclab.apps import runs as R
    from speclab.apps.dashboard import Dashboard
    tr = runs["blocks"]
    d = Dashboard()
    d.show_trace(tr)
    assert not d.alert.visible and d.viewer.player.end == len(tr.denoise) - 1
    assert d.viewer.step_fig.object.layout.title.text.startswith(f"{tr.method}: step 1/")
    assert "step 1 of" in d.viewer.detail.object and "tokens per forward" in d.viewer.status.object
    d.viewer.player.value = 2
    assert d.viewer.step_fig.object.layout.meta["step"] == 2 and "step 3 of" in d.viewer.detail.object
    shown = [p.object for p in d.viewer.summary_figs if p.visible]
    assert len(shown) == 2 and shown[1].layout.title.text.startswith("decoding order")
    names = R.method_names()
    assert len(names) == len(set(names)) and "dllm-threshold" in names
    assert "dllm-threshold" not in d.compare_methods.options           # compare is tau / alpha vs greedy ar
    d.form.method.value = "dllm-threshold"
    assert d.form.gen_length.visible and d.form.block_length.visible and d.form.threshold.visible
    assert not d.form.max_new_tokens.visible and not d.form.k.visible and not d.form.draft.visible
    assert list(d.form.target.options) == R.zoo_models()["diffusion"]
    d.form.gen_length.value = 24
    assert list(d.form.block_length.options) == [4, 6, 8, 12, 24]
    kw = R.method_kwargs("dllm-threshold", d.form.knob_values())
    assert kw["gen_length"] == 24 and kw["block_length"] in d.form.block_length.options and "k" not in kw
    if not R.zoo_models()["diffusion"]:                   # before digits-dllm / code-dllm are trained
        assert d.run_now() is None and "masked-diffusion" in d.alert.object


def test_canvas_legend_has_its_own_swatches_and_upright_short_tokens(runs):
    """The confidence bars' legend swatch took the first bar's colour (orange when that slot was
    committed): the bars stay out of the legend, fixed swatches stand for them; short tokens on a
    canvas that has room for them are written upright."""
    from speclab.figures import canvas_figure, colors
    from speclab.figures.diffusion import rotated
    tr = runs["threshold"]
    fig = canvas_figure(tr, 0)
    bars = next(t for t in fig.data if t.name == "confidence of masked positions")
    assert bars.showlegend is False
    swatches = {t.name: t.marker.color for t in fig.data if t.x == (None,)}
    assert all(swatches[label] == colors.PROPOSAL[k] for k, label in colors.PROPOSAL_LABEL.items())
    assert fig.layout.legend.itemsizing == "constant"
    assert not rotated(tr) and bars.textangle == 0


def test_a_long_canvas_of_words_wraps_into_rows_of_upright_text():
    """64 slots of words do not fit one row lying down: the canvas wraps at 16 slots a row (text
    upright, read on a projector) and the active block is outlined row by row."""
    from speclab.figures import canvas_figure
    from speclab.figures.diffusion import ROW, canvas_rows, row_shade
    from speclab.trace import DenoiseStep, Trace
    words = {5: " because", 6: " sky", 7: " the"}
    toks = [5, 6, 7, 6] * 16
    tr = Trace(engine="diffusion", method="dllm-threshold", params={"gen_length": 64, "eos_id": 0, "mask_id": 1},
               token_text={1: "<|mask|>", **words},
               denoise=[DenoiseStep(block=(0, 32), masked=list(range(64)), top1=toks, conf=[0.5] * 64,
                                    margin=[0.1] * 64, committed=list(range(64)), tokens=toks)])
    assert canvas_rows(tr) == (16, False)
    fig = canvas_figure(tr, 0)
    cells = fig.data[1]
    assert list(cells.x[:18]) == list(range(16)) + [0, 1] and cells.base[17] == -ROW and cells.textangle == 0
    xs, ys = row_shade(0, 32, 16)
    assert xs.count(None) == 1 and min(x for x in xs if x is not None) == -0.5 and max(x for x in xs if x is not None) == 15.5
    assert list(fig.data[0].x) == xs
