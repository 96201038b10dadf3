"""The embedded zoo loads through plain transformers calls, offline, and is small."""
from pathlib import Path

import pytest
import torch

from speclab.models import zoo
from speclab.models.zoo import ZOO_DIR, ModelLoadError, load, tokenizer_dir


def test_zoo_loads_with_transformers_auto_classes():
    """The code models share one tokenizer, speclab/zoo/tokenizer/, found beside their directories."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    for name in ("code-target", "code-draft"):
        m = AutoModelForCausalLM.from_pretrained(ZOO_DIR / name)
        tok = AutoTokenizer.from_pretrained(tokenizer_dir(ZOO_DIR / name))
        assert tokenizer_dir(ZOO_DIR / name) == str(ZOO_DIR / "tokenizer")
        assert m.config.model_type == "llama" and len(tok) == m.config.vocab_size == 8192
        assert tok.mask_token == "<|mask|>"


def test_the_zoo_ships_the_code_tokenizer_once():
    shared = (ZOO_DIR / "tokenizer" / "tokenizer.json").read_bytes()
    assert [f.parent.name for f in sorted(ZOO_DIR.glob("*/tokenizer.json")) if f.read_bytes() == shared] == ["tokenizer"]
    for name in ("code-target", "code-draft", "code-dllm"):
        assert load(name, device="cpu")[1].mask_token == "<|mask|>"


def test_a_checkpoint_with_its_own_tokenizer_loads_with_it(tmp_path):
    """A user's directory beside the zoo's shared tokenizer still reads its own files."""
    import shutil
    from transformers import AutoTokenizer
    own = tmp_path / "mine"
    shutil.copytree(ZOO_DIR / "code-draft", own)
    tok = AutoTokenizer.from_pretrained(ZOO_DIR / "tokenizer")
    tok.add_special_tokens({"additional_special_tokens": ["<|mine|>"]})
    tok.save_pretrained(own)
    shutil.copytree(ZOO_DIR / "tokenizer", tmp_path / "tokenizer")      # a shared one beside it too
    assert "<|mine|>" in load(str(own), device="cpu")[1].get_vocab()
    (own / "tokenizer.json").unlink()
    (own / "tokenizer_config.json").unlink()
    assert "<|mine|>" not in load(str(own), device="cpu")[1].get_vocab()   # none of its own: the shared one


def test_load_upcasts_and_sizes():
    t, _ = load("code-target", device="cpu")
    d, _ = load("code-draft", device="cpu")
    assert next(t.parameters()).dtype == torch.float32
    n_t, n_d = (sum(p.numel() for p in m.parameters()) for m in (t, d))
    assert 10e6 < n_t < 30e6 and 1e6 < n_d < 4e6
    assert t.config.speclab_exit_layers == [2, 4, 6]


def test_toy_zoo_under_80_mb():
    """The toy zoo, in the core wheel that a bare `pip install speclab`, the tests and the lessons use
    (~53 MB: code-target 24 MB, the drafts, heads and transfers of the trained methods 1-4 MB each):
    a package that still installs in seconds. The SmolLM2 parts are in speclab-zoo, not here."""
    size = sum(f.stat().st_size for f in Path(ZOO_DIR).rglob("*") if f.is_file() and "checkpoint" not in f.parts)
    assert size < 80e6
    assert not list(Path(ZOO_DIR).glob("smollm2-*")), "SmolLM2 parts go to speclab-zoo/speclab_zoo/"


def test_zoo_names_reach_the_data_package_and_say_when_it_is_missing(monkeypatch):
    """A SmolLM2 part resolves from speclab-zoo by its name, after the toy zoo; without the package,
    asking for one says how to install it."""
    assert zoo.zoo_dirs()[0] == ZOO_DIR
    assert Path(zoo.resolve("smollm2-draft")).parent.name == "speclab_zoo"
    assert zoo.zoo_path("code-target") == ZOO_DIR / "code-target" and zoo.zoo_path("../code-target") is None
    assert "smollm2-eagle" in zoo.zoo_names() and "code-draft" in zoo.zoo_names()
    monkeypatch.setattr(zoo, "zoo_dirs", lambda: (ZOO_DIR,))
    with pytest.raises(ModelLoadError, match=r"speclab-zoo package.*pip install ./speclab-zoo"):
        zoo.resolve("smollm2-draft")


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
    from speclab.prompts import SETS, load_prompts
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
