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
# the dashboard opens on the tiny code zoo in tests (its default is the real model when installed)
os.environ.setdefault("SPECLAB_DASHBOARD_TARGET", "code-target")


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
