"""The wheel stays under PyPI's 100 MB file limit as trained parts join the zoo: its size is projected
from the checkout without building it (scripts/wheel_size.py), and checked against a wheel that
setuptools builds from a small project laid out the same way."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import wheel_size  # noqa: E402


@pytest.mark.parametrize("dist", sorted(wheel_size.DISTRIBUTIONS))
def test_projected_wheel_stays_under_budget(dist):
    """Each wheel's projected size is at most BUDGET (95 MB, 5 below PyPI's limit): `speclab` with the
    toy zoo, `speclab-zoo` with the SmolLM2 parts (docs/architecture.md, "The wheel's size", says
    which split comes next)."""
    root = wheel_size.DISTRIBUTIONS[dist]
    parts = wheel_size.projected_parts(root)
    assert any(p.path.suffix == ".safetensors" for p in parts), "no zoo weights found: the reading is off"
    total = wheel_size.projected_size(root, parts=parts)
    assert total <= wheel_size.BUDGET, (
        f"the {dist} wheel would be {total / 1e6:.1f} MB (budget {wheel_size.BUDGET / 1e6:.0f} MB, PyPI "
        f"{wheel_size.PYPI_LIMIT / 1e6:.0f} MB): split as docs/architecture.md says "
        f"(python scripts/wheel_size.py lists the largest parts)")


def test_the_real_models_parts_are_in_the_data_package_not_the_core_wheel():
    """Every SmolLM2 part ships in speclab-zoo, none in speclab's own wheel (which a bare install and
    the tests use), and both name their files by the same patterns."""
    core = {p.parts[2] for p in wheel_size.packaged_files(wheel_size.ROOT) if p.parts[1:2] == ("zoo",)}
    data = {p.parts[1] for p in wheel_size.packaged_files(wheel_size.DISTRIBUTIONS["speclab-zoo"])
            if len(p.parts) > 2}
    assert not {n for n in core if n.startswith("smollm2-")}, "a SmolLM2 part is in the core wheel"
    assert {"smollm2-draft", "smollm2-eagle", "smollm2-dllm"} <= data and all(n.startswith("smollm2-") for n in data)


PYPROJECT = """[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "tiny"
version = "0.1"

[tool.setuptools.packages.find]
include = ["tiny", "tiny.*"]

[tool.setuptools]
include-package-data = false

[tool.setuptools.package-data]
tiny = ["zoo/**/*.json", "zoo/**/*.safetensors"]
"tiny.sub" = ["*.txt"]

[tool.setuptools.exclude-package-data]
tiny = ["zoo/**/checkpoint/*"]
"""


def _tiny_project(root: Path) -> None:
    """A project shaped like speclab's: found packages, a data folder that is no package, weights over
    DEFLATE_BELOW, an excluded checkpoint, and files no pattern names."""
    files = {"pyproject.toml": PYPROJECT, "README.md": "# tiny\n", "tiny/__init__.py": "X = 1\n",
             "tiny/mod.py": "def f():\n    return 2\n" * 50, "tiny/sub/__init__.py": "",
             "tiny/sub/seeds.txt": "a b\n" * 300, "tiny/sub/notes.md": "not data\n", "tiny/zoo/m/config.json": '{"a": 1}\n' * 40,
             "tiny/zoo/m/checkpoint/model.safetensors": "x" * 5000, "tiny/zoo/m/README.md": "log\n",
             "tiny/zoo/m/extra.py": "# no package here\n", "tiny/no.pkg/__init__.py": "", "other/__init__.py": ""}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    weights = np.random.default_rng(0).normal(0, 0.02, 900_000).astype(np.float16)   # 1.8 MB of fp16
    (root / "tiny/zoo/m/model.safetensors").write_bytes(b"{}" + weights.tobytes())


def test_projection_is_what_setuptools_builds(tmp_path):
    """The projected file list is the built wheel's, file for file, and the projected size within 2%
    of the wheel's (weights priced by entropy, the rest deflated)."""
    src, dist = tmp_path / "src", tmp_path / "dist"
    _tiny_project(src)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "-q", "-w", str(dist), str(src)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [wheel] = dist.glob("tiny-*.whl")
    with zipfile.ZipFile(wheel) as z:
        built = sorted(i.filename for i in z.infolist() if ".dist-info/" not in i.filename)
    assert [str(p) for p in wheel_size.packaged_files(src)] == built
    assert "tiny/zoo/m/model.safetensors" in built and "tiny/zoo/m/checkpoint/model.safetensors" not in built
    assert "tiny/zoo/m/extra.py" in built       # find's PEP 420 default makes any folder a package
    projected, real = wheel_size.projected_size(src), wheel.stat().st_size
    assert abs(projected - real) <= 0.02 * real, (projected, real)


def test_the_reading_refuses_what_it_does_not_model(tmp_path):
    (tmp_path / "pyproject.toml").write_text(PYPROJECT.replace("include-package-data = false",
                                                               'package-dir = { "tiny" = "src" }'))
    with pytest.raises(ValueError, match="package-dir"):
        wheel_size.packaged_files(tmp_path)
