import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the dashboard opens on the tiny code zoo in tests (its default is the real model when installed)
os.environ.setdefault("SPECLAB_DASHBOARD_TARGET", "code-target")


@pytest.fixture(scope="session")
def target():
    from speclab.models.zoo import load
    return load("code-target", device="cpu")


@pytest.fixture(scope="session")
def draft():
    from speclab.models.zoo import load
    return load("code-draft", device="cpu")


@pytest.fixture(scope="session")
def heldout_prompts():
    from speclab.bench.prompts import load_prompts
    return load_prompts("code-mixed", limit=12)
