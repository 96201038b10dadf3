"""The text a Panel page shows, read in Chromium: Panel draws every pane in a shadow root, which a
page's own innerText never enters. One walker for the dashboard scripts and the browser tests.

    page.evaluate(DEEP_TEXT, "speclab-output")     # the text under elements of that class, " | "-joined
"""

# the text under each element with the class, walking into every shadow root and skipping the
# stylesheets each one carries; not trimmed (an output may end in spaces: the load test compares it
# exactly)
DEEP_TEXT = """cls => { const out = [];
  const text = r => { const w = document.createTreeWalker(r, NodeFilter.SHOW_TEXT); let s = '', n;
    while ((n = w.nextNode())) if (n.parentElement && n.parentElement.tagName !== 'STYLE') s += n.textContent;
    return s; };
  const walk = r => r.querySelectorAll('*').forEach(e => {
    if (e.classList && e.classList.contains(cls)) out.push(text(e.shadowRoot || e));
    if (e.shadowRoot) walk(e.shadowRoot); });
  walk(document); return out.join(' | '); }"""

# the same, trimmed: what a check reads when the spaces around a text do not matter
DEEP_TEXT_TRIMMED = f"cls => ({DEEP_TEXT})(cls).trim()"
