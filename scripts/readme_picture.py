"""The README's picture: one round of smollm2-135m + its EAGLE head, from a real run.

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/readme_picture.py [--round 3] [--out docs/screenshots/smollm2-eagle-round.png]

Decodes a chat question with `eagle` (record "light"), exports the trace as HTML (`speclab export`),
opens it in Debian's Chromium through Playwright (executable /usr/bin/chromium), moves the slider to
`--round` (0-based) and saves the step figure, with the token strip's not-yet-generated rows cut out.
"""
import argparse
import tempfile
from pathlib import Path

import speclab
from speclab.export import to_html


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--round", type=int, default=3)
    ap.add_argument("--question", default="Why is the sky blue?")
    ap.add_argument("--out", default="docs/screenshots/smollm2-eagle-round.png")
    a = ap.parse_args()
    from PIL import Image
    from playwright.sync_api import sync_playwright
    r = speclab.generate("smollm2-135m", a.question, chat=True, method="eagle", max_new_tokens=48)
    with tempfile.TemporaryDirectory() as d:
        page_path, raw = Path(d) / "run.html", Path(d) / "raw.png"
        to_html(r.trace, page_path)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.goto(page_path.as_uri())
            page.wait_for_selector(".js-plotly-plot")
            page.evaluate("""k => { const g = document.querySelectorAll('.js-plotly-plot')[0];
                Plotly.animate(g, [String(k)], {mode: 'immediate', frame: {duration: 0, redraw: true},
                                                transition: {duration: 0}}); }""", a.round)
            page.wait_for_timeout(1500)
            fig = page.query_selector_all(".js-plotly-plot")[0].bounding_box()
            page.screenshot(path=str(raw), clip=dict(x=60, y=fig["y"], width=1010, height=fig["height"] - 5))
            browser.close()
        im = Image.open(raw).convert("RGB")
        # keep the title and the strip's rows up to this round, drop the covered rows of later tokens
        top, bottom = im.crop((0, 0, im.width, 158)), im.crop((0, 335, im.width, im.height))
        out = Image.new("RGB", (im.width, top.height + bottom.height), "white")
        out.paste(top, (0, 0))
        out.paste(bottom, (0, top.height))
        out.quantize(colors=256, method=Image.MEDIANCUT).save(a.out, optimize=True)
    print(f"wrote {a.out}: round {a.round + 1} of {len(r.trace.rounds)}, {r.text[:60]!r}...")


if __name__ == "__main__":
    main()
