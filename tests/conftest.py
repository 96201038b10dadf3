import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


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
