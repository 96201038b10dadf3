import os
from pathlib import Path

import pytest
import torch

SHOTS = Path(__file__).resolve().parents[1] / "docs" / "screenshots"


def shoot(page, name: str) -> None:
    """With SPECLAB_SCREENSHOTS=1, save what a browser test's page shows now as
    docs/screenshots/NAME.png: the README's pictures are taken by the browser tests
    (`SPECLAB_SCREENSHOTS=1 pytest -m browser`)."""
    if os.environ.get("SPECLAB_SCREENSHOTS"):
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.wait_for_timeout(500)                  # let plotly finish drawing
        page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)

# Under pytest-xdist (`make test` runs two workers) each worker gets its share of the cores, and so
# do the kernels, servers and Chromium pages it starts: OpenMP teams larger than the cores spin
# against each other. Set before any test imports speclab's kernel or starts a subprocess.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _SHARE = max(1, torch.get_num_threads() // _WORKERS)    # torch's own count: what one process would use
    os.environ["OMP_NUM_THREADS"] = str(_SHARE)
    torch.set_num_threads(_SHARE)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# every info key a method writes must be declared by a record type (speclab/records.py)
os.environ.setdefault("SPECLAB_STRICT_RECORDS", "1")
# the dashboard opens on the tiny code zoo in tests (its default is the real model when installed)
os.environ.setdefault("SPECLAB_DASHBOARD_TARGET", "code-target")


def pytest_terminal_summary(terminalreporter):
    """The CPU and the kernel paths its tests ran (tests/test_kernels.py runs each one the CPU
    supports), at the end of the run (-q hides a header), so a CI log says which paths it tested."""
    from speclab.models import kernels
    d = kernels.info()
    terminalreporter.write_line(f"speclab kernel: CPU {d['cpu']}; paths tested: {', '.join(d['supported']) or 'none (torch)'}; "
                                f"auto picks {d['path']}")


@pytest.fixture
def one_thread():
    """One torch thread for the test: thousands of tiny products (toy models, six-token rows) on 2
    threads only wait at each op's barrier, badly so on a busy 2-core machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def target():
    from speclab.models.zoo import load
    return load("code-target", device="cpu")


@pytest.fixture(scope="session")
def draft():
    from speclab.models.zoo import load
    return load("code-draft", device="cpu")


BAD_TRACES = [   # a trace file's text -> words of the one-line TraceError every reader of traces gives
    ("{not json", "not valid JSON"),
    ('{"engine": "speculative"}', "no 'schema'"),
    ('{"schema": "speclab.trace/9", "engine": "speculative"}', "newer than this speclab"),
    ('{"schema": "other/1"}', "unknown trace schema"),
    ('{"schema": "speclab.trace/1", "engine": "speculative"}', "corrupted trace"),
]


@pytest.fixture
def no_model_loads(monkeypatch):
    """A model load fails the test: what must be refused before any model loads (a typo never costs
    a run's minutes) is refused first."""
    import speclab.api
    import speclab.decoding.engines
    import speclab.decoding.spec_run

    def no_model(*_):
        raise AssertionError("a model loaded before the error")
    for door in (speclab.api, speclab.decoding.spec_run, speclab.decoding.engines):   # where runs load models
        monkeypatch.setattr(door, "as_model", no_model)


def refused_in_one_line(capsys, argv: list[str], msg: str) -> None:
    """`speclab argv` exits 2 with `msg` on stderr, and no traceback."""
    from speclab.cli import main
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and msg in err and "Traceback" not in err


def tiny_llama(seed: int = 0, **cfg):
    """A random LlamaForCausalLM of config `cfg` in eval mode, its weights drawn after
    torch.manual_seed(seed)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**cfg)).eval()


def toy_heads(target):
    """An EAGLE head (layer copied from the target's last) and Medusa heads with small random
    residuals, both over a trimmed vocabulary that leaves out the 50 highest ids (new modules on
    every call, so a test file may change its own)."""
    import torch
    from speclab.models.heads import build_eagle, build_medusa, head_config
    base, _ = target
    torch.manual_seed(0)
    ids = torch.arange(base.config.vocab_size - 50)
    eagle = build_eagle(base, head_config(base.config, "eagle"), ids)
    eagle.model.layers[0].load_state_dict(base.model.layers[-1].state_dict())
    medusa = build_medusa(base, head_config(base.config, "medusa", 3), ids)
    for w in medusa.w2:
        torch.nn.init.normal_(w.weight, std=0.02)
    return {"eagle": eagle.eval(), "medusa": medusa.eval()}


def sampled_drafts_are_point_mass(target, method, prompt=None, **kw) -> None:
    """A tree of the draft's top choices is verified under sampling by recursive rejection of
    point-mass children, the walk whose law test_sampling_power.py tests with power (tree-dynamic,
    T = 0.7 and 1, and the broken variant that verifies the same children as samples of q): so a
    method whose sampled rounds draft such trees, and tell the rule no q, emits the target's law.
    method: a name or a Drafter; prompt: text or ids (default a code line); kw: its draft and
    parameters."""
    import speclab
    prompt = "    def __repr__(self):\n        return" if prompt is None else prompt
    r = speclab.generate(target, prompt, method, max_new_tokens=16, temperature=1.0, seed=0, record="light", **kw)
    nodes = [n for rnd in r.trace.rounds for n in rnd.nodes]
    assert nodes and {n.rule for n in nodes} == {"point-mass"}, {n.rule for n in nodes}


@pytest.fixture(scope="session")
def heldout_prompts():
    from speclab.prompts import load_prompts
    return load_prompts("code-mixed", limit=12)


@pytest.fixture(scope="session")
def heldout_ar(target, heldout_prompts):
    """ar's ids, 32 new tokens, on the first two held-out prompts: what a lossless method must write."""
    import speclab
    return [speclab.generate(target, p, "ar", max_new_tokens=32, record=None).ids for p in heldout_prompts[:2]]


def greedy_identical_to_ar(target, prompts, method: str, draft, params: dict | None = None, refs=None,
                           max_new_tokens: int = 32, **kw) -> list:
    """`method` with `draft` and `params` (kw: generate's own, e.g. record) decodes each prompt greedily
    to ar's ids (`refs` where the caller has them, as heldout_ar), drafting and having drafts
    accepted. Returns the results."""
    import speclab
    params = params or {}
    if refs is None:
        refs = [speclab.generate(target, p, "ar", max_new_tokens=max_new_tokens, record=None).ids for p in prompts]
    runs = []
    for prompt, ref in zip(prompts, refs):
        r = speclab.generate(target, prompt, method, draft=draft, max_new_tokens=max_new_tokens, **kw, **params)
        assert r.ids == ref, f"{method} {params} diverged from ar on {prompt[:40]!r}"
        runs.append(r)
    assert sum(r.trace.totals.drafted for r in runs) > 0 and sum(r.trace.totals.accepted for r in runs) > 0
    return runs


def tokens_a_forward(target, prompt, method: str, **kw) -> float:
    """New tokens per target forward of `method` (kw: its draft and parameters), 32 new tokens."""
    import speclab
    t = speclab.generate(target, prompt, method, max_new_tokens=32, record=None, **kw).trace.totals
    return t.new_tokens / t.target_forwards


def trainer_runs(target, tmp_path, monkeypatch, kind: str, *args: str):
    """`speclab train <kind> --self-text 6` (Clover's, Falcon's) on the toy target with `args`, for a
    couple of seconds, its text and checkpoints under tmp_path: the saved head loads through the zoo
    and decodes identically to ar. Returns the head."""
    import importlib

    import speclab
    from speclab.models import zoo
    from speclab.train import clover
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))          # the trainer's checkpoints
    monkeypatch.setattr(clover, "CACHE", str(tmp_path / "text"))
    out = tmp_path / kind
    assert importlib.import_module(f"speclab.train.{kind}").main([
        "--target", "code-target", "--self-text", "6", "--max-new", "12", "--out", str(out), *args, "--minutes", "0.03",
        "--seq-len", "16", "--batch", "2", "--warmup", "1", "--threads", "1", "--held-frac", "0.2"]) == 0
    assert (out / "model.safetensors").exists() and (out / "speclab_train.json").exists()
    head = zoo.load(str(out))[0]
    ref = speclab.generate(target, "def f(x):", "ar", max_new_tokens=12, record=None).ids
    assert speclab.generate(target, "def f(x):", kind, draft=(head, target[1]), max_new_tokens=12).ids == ref
    return head


def one_distribution(B: int = 2, T: int = 12, N: int = 400):
    """A head's training batch with one distribution to learn everywhere: tokens (B, T) over N ids,
    the target's log-probs (B, T, N), a full mask (B, T)."""
    import torch
    tok = torch.randint(0, N, (B, T))
    lp = (3 * torch.randn(N)).log_softmax(-1).expand(B, T, -1)
    return tok, lp, torch.ones(B, T, dtype=torch.bool)
