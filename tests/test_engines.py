"""One Engine row per engine (decoding/engines.py): a fourth engine joins by one row, one method
row and one view, run, replayed, counted and exported with no edit elsewhere; and nothing outside
the rows compares engine names."""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import speclab
from speclab.decoding.engines import (DIFFUSION, ENGINES, SPECULATIVE, Engine, check_pairing, engine_of, get_engine,
                                      registered_engine)
from speclab.decoding.registry import METHODS, Method, get_method, registered
from speclab.decoding.result import Result
from speclab.export import to_html
from speclab.figures import n_steps, step_label, step_title
from speclab.figures.views import VIEWS, FigureSpec, View, added_view, step_view, view_of
from speclab.models.loading import as_model, encode_prompt, model_info, token_table
from speclab.trace import STEPS, Round, Sampling, Steps, Totals, Trace, TraceError, replay

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "def add(a, b):\n    return"


# -- a toy fourth engine: greedy, one forward (no cache) and one step per token -------------------
@dataclass
class JacobiConfig:
    window: int = 1                     # a knob, so the method has a parameter to check


def run_jacobi(target, prompt, method: str, max_new_tokens: int = 6, record="light", seed=0, device=None,
               dtype="auto", draft=None, chat=False, temperature=0.0, progress=None, **params) -> Result:
    model, tok = as_model(target, device, dtype)
    ids = encode_prompt(tok, prompt, max_new_tokens, None)
    new, rounds, t0 = [], [], time.perf_counter()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            t = int(model(torch.tensor([ids + new])).logits[0, -1].argmax())
            rounds.append(Round(emitted=t, emitted_kind="target", kept=1))
            new.append(t)
    totals = Totals(wall_s=time.perf_counter() - t0, target_forwards=len(new), new_tokens=len(new))
    trace = Trace(engine="jacobi", method=method, params=dict(params, max_new_tokens=max_new_tokens),
                  models={"target": model_info(model, "code-target")}, sampling=Sampling(0.0, None, None, seed),
                  record=record, prompt_ids=ids, output_ids=new, totals=totals, rounds=rounds)
    trace.token_text = token_table(tok, trace.mentioned_ids())
    return Result(text=tok.decode(new), ids=new, trace=trace)


JACOBI_STEPS = Steps(engine="jacobi", field="rounds", noun="token", rate="tokens per forward",
                     count=lambda t: len(t.rounds), replay=lambda t: [r.emitted for r in t.rounds])
JACOBI = Engine(name="jacobi", kind="causal", kind_is="a causal LM", decoders="jacobi",
                wrong_target="{method} decodes causal LMs, not {target} ({its}): decode it with {use}",
                run=run_jacobi, steps=JACOBI_STEPS)
JACOBI_METHOD = Method(name="jacobi", family="jacobi", engine="jacobi", guarantee="identical-to-ar",
                       summary="a toy: greedy, one forward per token", config=JacobiConfig, sampling=False)


def tokens_frame(trace: Trace, step: int = 0, static: bool = True) -> dict:
    toks = trace.output_ids[: step + 1]
    return dict(data=[dict(type="bar", x=list(range(len(toks))), y=[1] * len(toks),
                           text=[trace.text_of(t) for t in toks])],
                layout=dict(title=dict(text=step_title(trace, step)), height=300))


JACOBI_VIEW = View("jacobi", step=(step_view("tokens", tokens_frame),),
                   summary=(FigureSpec("forwards", lambda tr, step=None: None),))


def test_a_fourth_engine_is_one_row_one_method_and_one_view(target, tmp_path):
    with registered_engine(JACOBI), registered(JACOBI_METHOD), added_view(JACOBI_VIEW):
        r = speclab.run(target, PROMPT, "jacobi", max_new_tokens=6, window=2)
        ar = speclab.run(target, PROMPT, "ar", max_new_tokens=6)
        assert r.ids == ar.ids and r.trace.params["window"] == 2      # greedy: the same tokens as ar
        assert engine_of(r.trace) is JACOBI and r.trace.steps_row() is JACOBI_STEPS
        assert replay(r.trace) == r.ids and n_steps(r.trace) == 6
        assert step_label(r.trace) == "token" and step_title(r.trace, 2) == "token 3 of 6"
        assert r.trace.totals.tau == 1.0 and r.stats["new_tokens"] == 6
        # its traces load (checked) and replay with no model, and export with their own view
        back = Trace.load(r.trace.save(tmp_path / "j.json"))
        assert replay(back) == r.ids and view_of(back).main.name == "tokens"
        page = to_html(back, tmp_path / "j.html").read_text()
        assert "tokens per forward 1.00" in page and "token 1 of 6" in page
        # what the engine does not take is refused in one line by the one door
        with pytest.raises(ValueError, match="no verify"):
            speclab.run(target, PROMPT, "jacobi", rule="typical")
        with pytest.raises(ValueError, match="one prompt at a time"):
            speclab.run(target, [PROMPT, PROMPT], "jacobi")
        with pytest.raises(ValueError, match="jacobi decodes causal LMs, not digits-dllm"):
            speclab.run("digits-dllm", PROMPT, "jacobi")
        with pytest.raises(ValueError, match="does not take"):
            JACOBI.check(JACOBI_METHOD, {"windows": 3})
    assert "jacobi" not in ENGINES and "jacobi" not in STEPS and "jacobi" not in METHODS and "jacobi" not in VIEWS
    with pytest.raises(TraceError, match="engine is 'jacobi', not one of speculative, diffusion, dag"):
        Trace.load(tmp_path / "j.json")


def test_the_rows_hold_what_each_engine_decides():
    assert [e.name for e in ENGINES.values()][:3] == ["speculative", "diffusion", "dag"]
    assert (SPECULATIVE.verify, SPECULATIVE.draft, SPECULATIVE.batch) == (True, True, True)
    assert not (DIFFUSION.verify or DIFFUSION.draft or DIFFUSION.batch)
    assert {e.name: (e.kind, e.noun, e.rate) for e in ENGINES.values()} == {
        "speculative": ("causal", "round", "tau"), "diffusion": ("diffusion", "step", "tokens per forward"),
        "dag": ("dag", "strategy", "tau")}
    assert {e.steps.field for e in ENGINES.values()} == {"rounds", "denoise", "dag"}
    with pytest.raises(ValueError, match="unknown engine 'jacobi'"):
        get_engine("jacobi")
    with pytest.raises(ValueError, match="already registered"):
        with registered_engine(SPECULATIVE):
            pass
    # the diffusion row's check takes the noise canvas's knobs only where the sampler runs one
    DIFFUSION.check(get_method("dllm-entropy-bound"), {"entropy_bound": 0.2, "t_min": 0.1})
    with pytest.raises(ValueError, match="does not take"):
        DIFFUSION.check(get_method("dllm-threshold"), {"t_min": 0.1})
    with pytest.raises(ValueError, match="threshold"):
        DIFFUSION.check(get_method("dllm-threshold"), {"threshold": "high"})


def test_pairing_errors_come_from_the_rows():
    with pytest.raises(ValueError, match="numwords-dat is a DA-Transformer: decode it with a dag-\\* method"):
        check_pairing(SPECULATIVE, "ar", "numwords-dat")
    with pytest.raises(ValueError, match="takes no draft model: a masked-diffusion LM"):
        check_pairing(DIFFUSION, "dllm-threshold", "digits-dllm", draft="code-draft")
    check_pairing(SPECULATIVE, "dllm-draft", "code-target", draft="digits-dllm", draft_kind="dllm")


# -- no engine names compared outside the rows --------------------------------------------------------
ENGINE_COMPARISON = r"engine(\([^)]*\))?\s*(==|!=|not in|in) "
# the rows themselves, and the view spec's mapping from an engine to its views
ALLOWED = {"speclab/decoding/engines.py", "speclab/figures/views.py"}
ENGINE_FILES = ["speclab/decoding/speculative.py", "speclab/decoding/dllm_run.py", "speclab/decoding/diffusion.py",
                "speclab/decoding/dag.py", "speclab/decoding/batch.py", "speclab/api.py",
                "speclab/decoding/spec_run.py", "speclab/decoding/engines.py", "speclab/decoding/freedave.py"]


def grep(pattern: str, files) -> list[str]:
    out = subprocess.run(["git", "grep", "--untracked", "-nE", pattern, "--", *files], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.splitlines()


def test_no_engine_name_is_compared_outside_the_rows():
    hits = [h for h in grep(ENGINE_COMPARISON, ["speclab/*.py"]) if h.split(":")[0] not in ALLOWED]   # apps too
    assert hits == []
    assert grep(ENGINE_COMPARISON, ["speclab/figures/views.py"])        # the pattern does find one


def test_engine_files_read_declared_capabilities_not_hasattr():
    assert grep(r"hasattr\((policy|drafter)\b", ENGINE_FILES) == []
    assert all((ROOT / f).exists() for f in ENGINE_FILES)
    assert re.search(r"hasattr\((policy|drafter)\b", 'if hasattr(drafter, "x")')
