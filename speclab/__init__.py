"""speclab: see and measure fast decoding of language models.

    import speclab
    r = speclab.generate("code-target", "def parse(", method="draft-model", draft="code-draft")
    r.text, r.stats, r.trace
"""
from speclab.api import Result, generate
from speclab.decoding.registry import methods
from speclab.models.zoo import load
from speclab.trace import Trace, TraceError, replay

__version__ = "0.1.0"
__all__ = ["generate", "methods", "load", "Result", "Trace", "TraceError", "replay"]
