"""Every numeric parameter against its bound (speclab.params.BOUNDS), at every door that parses one:
the API (each engine's check), the CLI, the dashboard's form, its URL arguments and the run service.
A value past its bound is refused in one line that names the bound, before any model loads."""
from __future__ import annotations

import numbers
import typing

import pytest

import speclab
from speclab.apps import runs
from speclab.cli import main
from speclab.decoding.registry import get_method, method_defaults, param_types
from speclab.params import BOUNDS, UNBOUNDED, check_bounds


def _numeric(hint, default) -> bool:
    if typing.get_origin(hint) in (list, tuple):          # token ids (an oracle's reference), not a number
        return False
    arms = typing.get_args(hint) or (hint,)
    return any(t in (int, float) for t in arms) or (isinstance(default, numbers.Real) and not isinstance(default, bool))


def test_every_numeric_method_parameter_has_a_bound():
    """A method that joins with a new number joins the table too (or says why it needs none)."""
    loose = set()
    for m in runs.method_names():
        defaults = method_defaults(m)
        for name, hint in param_types(get_method(m)).items():
            if _numeric(hint, defaults.get(name)) and name not in BOUNDS and name not in UNBOUNDED:
                loose.add(f"{m}: {name}")
    assert not loose, f"numeric parameters with no bound in speclab.params.BOUNDS: {sorted(loose)}"
    assert not set(BOUNDS) & UNBOUNDED


def test_a_bound_is_a_one_line_refusal_and_the_bound_itself_passes():
    check_bounds("m", {"k": BOUNDS["k"][0], "threshold": 1e9, "schedule": "fixed", "overlap": True})
    with pytest.raises(ValueError) as e:
        check_bounds("method 'prompt-lookup'", {"k": 1000})
    assert str(e.value) == ("method 'prompt-lookup': k=1000 is past its bound of 64 (draft tokens a round): "
                            "ask for 64 or less")
    with pytest.raises(ValueError, match="steps=1000000000 is past its bound of 8192"):
        check_bounds("", {"steps": 10**9})
    with pytest.raises(ValueError, match="k=inf is not a finite number"):
        check_bounds("", {"k": float("inf")})


@pytest.mark.parametrize("target,prompt,method,kw,words", [
    ("code-target", "def f(x):", "prompt-lookup", dict(k=1000), "k=1000 is past its bound of 64"),
    ("digits-dllm", "SUM 27=", "dllm-lowconf", dict(steps=10**9), "steps=1000000000 is past its bound of 8192"),
    ("dates-dat", "2024-03-05", "dag-beam", dict(beam_size=10**6), "beam_size=1000000 is past its bound of 1024"),
])
def test_the_api_refuses_a_value_past_its_bound(target, prompt, method, kw, words):
    with pytest.raises(ValueError, match=words) as e:
        speclab.run(target, prompt, method, **kw)
    assert "\n" not in str(e.value)


def test_the_cli_refuses_a_value_past_its_bound(capsys):
    code = main(["run", "--target", "code-target", "--method", "prompt-lookup", "--k", "1000", "--prompt", "def f(x):"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == ("speclab: error: method 'prompt-lookup': k=1000 is past its bound of 64 "
                                 "(draft tokens a round): ask for 64 or less")
    code = main(["run", "--target", "digits-dllm", "--method", "dllm-lowconf", "--param", "steps=1000000000",
                 "--prompt", "SUM 27="])
    assert code == 2 and "steps=1000000000 is past its bound of 8192" in capsys.readouterr().err


@pytest.fixture
def page():
    from speclab.apps.dashboard import Dashboard
    return Dashboard()


def test_the_form_refuses_a_value_past_its_bound(page):
    """The knobs' sliders stop inside the bounds; the "other parameters" box does not, so the form
    checks what it sends."""
    f = page.form
    f.method.value, f.extra.value = "prompt-lookup", "k=1000"
    with pytest.raises(ValueError, match="prompt-lookup: k=1000 is past its bound of 64"):
        f.request()
    f.method.value, f.extra.value = "dllm-lowconf", "steps=1000000000"
    with pytest.raises(ValueError, match="steps=1000000000 is past its bound of 8192"):
        f.request()
    assert page.run_now() is None and "past its bound" in page.alert.object
    for name, knob in f.knobs.items():
        end = getattr(knob, "end", None)
        assert end is None or name not in BOUNDS or end <= BOUNDS[name][0], name


def test_a_url_past_a_bound_is_refused_and_changes_nothing(page):
    f = page.form
    k = f.k.value
    assert not page.apply_args({"method": [b"draft-model"], "k": [b"1000"], "run": [b"1"]})
    assert page.alert.visible and "k=1000 is past its bound of 64" in page.alert.object
    assert f.k.value == k and f.method.value != "draft-model"         # nothing of the link was applied
    assert not page.apply_args({"max_new_tokens": [b"100000000"]}) and "max_new_tokens=100000000" in page.alert.object
    assert page.apply_args({"method": [b"draft-model"], "k": [b"6"], "run": [b"1"]}) and f.k.value == 6


def test_the_run_service_refuses_what_its_limits_do_not_name():
    from speclab.apps.service import Limits
    Limits().check({"method": "dllm-lowconf", "steps": 64, "seed": 10**12})
    with pytest.raises(ValueError, match="dllm-lowconf: steps=1000000000 is past its bound"):
        Limits().check({"method": "dllm-lowconf", "steps": 10**9})
    with pytest.raises(ValueError, match="k=32 is over this server's limit of 16"):     # its own, tighter
        Limits().check({"method": "draft-model", "k": 32})
