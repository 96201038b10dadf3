"""speclab: see and measure fast decoding of language models.

    import speclab
    r = speclab.generate("code-target", "def parse(", method="draft-model", draft="code-draft")
    r.text, r.stats, r.trace
"""
from speclab.api import Result, generate, run
from speclab.decoding.drafters.lookup import SuffixHistory
from speclab.decoding.registry import methods
from speclab.models.zoo import load
from speclab.trace import Trace, TraceError, replay

__version__ = "0.1.0"


def show(trace_or_result, **kw):
    """A Jupyter player for a trace, a Result or a saved trace path (needs the notebook extra)."""
    from speclab.widgets import show as _show
    return _show(trace_or_result, **kw)


def race(*runs, labels=None, slow: float = 1.0):
    """ar and speculative runs typing side by side at the pace they ran (Results or Traces; the
    first is the speed-up's reference). In Jupyter it displays; elsewhere it returns the HTML page."""
    from speclab.figures.race import race_html, race_iframe
    traces = [r.trace if isinstance(r, Result) else r for r in runs]
    try:
        from IPython.display import HTML
    except ImportError:
        return race_html(traces, labels, slow)
    return HTML(race_iframe(traces, labels, slow))
__all__ = ["generate", "run", "methods", "load", "Result", "Trace", "TraceError", "replay", "show", "race", "SuffixHistory"]
