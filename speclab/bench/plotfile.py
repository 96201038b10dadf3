"""A plotly figure saved as a file: offline HTML, or a PNG rendered by Debian's Chromium."""
from __future__ import annotations

import os
import tempfile


def save_plot(fig, path: str) -> None:
    """The figure as offline HTML (plotly.js inside), or as PNG through Debian's Chromium."""
    html = fig.to_html(include_plotlyjs=True, full_html=True)
    if not path.endswith(".png"):
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(html)
        os.replace(tmp, path)
        return
    from playwright.sync_api import sync_playwright
    with tempfile.TemporaryDirectory() as d, sync_playwright() as p:
        page_file = os.path.join(d, "plot.html")
        with open(page_file, "w", encoding="utf-8") as f:
            f.write(html)
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": int(fig.layout.width or 900), "height": int(fig.layout.height or 500)})
        page.goto("file://" + page_file)
        page.wait_for_selector(".main-svg")
        page.screenshot(path=path + ".tmp.png")
        browser.close()
        os.replace(path + ".tmp.png", path)
