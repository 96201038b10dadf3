"""The command line: JSON output, colored output, and one-line errors with exit code 2."""
import json

import pytest
from conftest import BAD_TRACES

from speclab.cli import main

BASE = ["run", "--target", "code-target", "--max-new-tokens", "8"]


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_run_json(capsys):
    code, out, _ = run(capsys, *BASE, "--prompt", "def ", "--json")
    d = json.loads(out)
    assert code == 0 and d["new_tokens"] == 8 and len(d["ids"]) == 8
    assert {"text", "ids", "method", "target_forwards", "draft_forwards", "tau", "alpha", "wall_s"} <= set(d)


def test_run_check_and_trace(capsys, tmp_path):
    tr = tmp_path / "run.json"
    code, out, _ = run(capsys, *BASE, "--method", "draft-model", "--draft", "code-draft", "--k", "3",
                       "--prompt", "import os\n", "--json", "--check", "--trace", str(tr))
    d = json.loads(out)
    assert code == 0 and d["identical"] is True and tr.exists()
    assert d["target_forwards"] < 8 + 1 and d["draft_forwards"] > 0


def test_run_colored(capsys):
    code, out, _ = run(capsys, *BASE, "--method", "prompt-lookup", "--prompt", "a = 1\nb = 2\na = 1\n",
                       "--color", "always")
    assert code == 0 and "\033[2ma = 1" in out and "tau" in out


def test_methods_table(capsys):
    code, out, _ = run(capsys, "methods", "--json")
    names = {m["name"] for m in json.loads(out)}
    assert code == 0 and {"ar", "draft-model", "layer-skip", "prompt-lookup", "suffix", "recycling", "lookahead"} <= names


@pytest.mark.parametrize("args,words", [
    (["--target", "no-such-model", "--prompt", "x"], "unknown model 'no-such-model'"),
    (["--target", "/tmp/definitely/missing/dir", "--prompt", "x"], "unknown model"),
    (["--prompt", "   "], "empty prompt"),
    (["--prompt", "x", "--max-new-tokens", "0"], "max_new_tokens must be"),
    (["--prompt", "x " * 600], "exceeds the model's context window"),
    (["--prompt", "x", "--method", "beam"], "unknown method 'beam'; known methods: ar, draft-model"),
    (["--prompt", "x", "--method", "draft-model", "--draft", "code-draft", "--k", "0"], "k must be an integer >= 1"),
    (["--prompt", "x", "--method", "draft-model", "--draft", "code-draft", "--threshold", "1.5"], "threshold must be in (0, 1)"),
    (["--prompt", "x", "--temperature", "-1"], "temperature must be >= 0"),
    (["--prompt", "x", "--method", "eagle"], "needs an EAGLE head for this target"),
    (["--prompt", "x", "--method", "layer-skip", "--exit-layer", "8"], "exit layer must be in 1..7"),
])
def test_bad_input_is_one_line_exit_2(capsys, args, words):
    code, out, err = run(capsys, "run", "--max-new-tokens", "4", *args)
    assert code == 2
    assert err.startswith("speclab: error: ") and words in err and err.count("\n") == 1
    assert "Traceback" not in err


@pytest.mark.parametrize("args,words", [
    (["--target", "numwords-dat", "--method", "draft-model", "--draft", "code-draft", "--prompt", "12"],
     "numwords-dat is a DA-Transformer: decode it with a dag-* method"),
    (["--target", "numwords-dat", "--method", "prompt-lookup", "--prompt", "12"], "is a DA-Transformer"),
    (["--target", "code-target", "--method", "draft-model", "--draft", "numwords-dat", "--prompt", "x"],
     "the draft numwords-dat is a DA-Transformer"),
    (["--target", "code-target", "--method", "draft-model", "--draft", "code-dllm", "--prompt", "x"],
     "the draft code-dllm is a masked-diffusion LM"),
    (["--target", "code-dllm", "--method", "ar", "--prompt", "x"], "is a masked-diffusion LM"),
    (["--target", "numwords-dat", "--method", "dllm-threshold", "--prompt", "12"], "not a masked-diffusion LM"),
    (["--target", "digits-dllm", "--method", "dag-viterbi", "--prompt", "12"], "needs a DA-Transformer target"),
])
def test_engine_and_model_must_pair(capsys, args, words):
    """Checked once, in speclab.run's seam, for every engine: one line, never a traceback."""
    code, _, err = run(capsys, "run", "--max-new-tokens", "4", *args)
    assert code == 2 and words in err and err.count("\n") == 1 and "Traceback" not in err


def test_engine_and_model_pairing_in_the_api():
    import speclab
    with pytest.raises(ValueError, match="is a DA-Transformer"):
        speclab.run("numwords-dat", "12", "draft-model", draft="code-draft")
    with pytest.raises(ValueError, match="takes no draft model"):
        speclab.run("numwords-dat", "12", "dag-viterbi", draft="code-draft")
    dag = speclab.models.zoo.load_shared("numwords-dat")
    with pytest.raises(ValueError, match="is a DA-Transformer"):         # a loaded pair is checked too
        speclab.generate(dag, "12", "ar")


def test_vocab_mismatch_names_both_sizes(capsys, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    from speclab.models.zoo import load
    _, tok = load("code-draft")
    small = LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    small.save_pretrained(tmp_path / "other")
    tok.save_pretrained(tmp_path / "other")
    code, _, err = run(capsys, "run", "--prompt", "x", "--method", "draft-model", "--draft", str(tmp_path / "other"))
    assert code == 2 and "different vocabularies (target 8192 tokens, draft 1000)" in err


@pytest.mark.parametrize("content,words", BAD_TRACES)
def test_bad_trace_files(tmp_path, content, words):
    from speclab.trace import Trace, TraceError
    f = tmp_path / "t.json"
    f.write_text(content)
    with pytest.raises(TraceError, match=words):
        Trace.load(f)


def test_run_dag_json(capsys):
    code, out, _ = run(capsys, "run", "--target", "numwords-dat", "--method", "dag-viterbi", "--prompt", "305", "--json")
    d = json.loads(out)
    assert code == 0 and d["text"].startswith("three hundred") and d["text"].endswith("five")
    assert d["target_forwards"] == 1 and d["new_tokens"] == len(d["ids"])


@pytest.mark.parametrize("args,words", [
    (["--target", "numwords-dat", "--method", "dag-viterbi", "--prompt", "abc"], "digits only"),
    (["--target", "code-target", "--method", "dag-viterbi", "--prompt", "12"], "needs a DA-Transformer target"),
])
def test_dag_bad_input(capsys, args, words):
    code, _, err = run(capsys, "run", *args)
    assert code == 2 and words in err and err.count("\n") == 1
