"""A wheel built from the checkout installs and works like the source: every package folder, the
package data (the zoo, the prompt sets, the kernel's source, the dashboard's examples), the console
script and the bf16 CPU kernel's build, all from the installed copy.

The wheel is built once per run (the `wheel` fixture) with `pip wheel --no-deps --no-build-isolation
--no-index`, from a copy of the files the build reads, so nothing is downloaded and nothing is written
into the checkout. The `installed` fixture installs it with --no-deps into a fresh venv whose
site-packages holds a .pth line naming this interpreter's site-packages: torch, transformers and the
rest come from there, speclab only from the wheel. A .pth line puts a folder on sys.path without
running the .pth files inside it, so the checkout's editable install stays off in the fresh venv.
"""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "speclab")
ZOO_DATA = {".json", ".safetensors", ".txt", ".jinja"}


def _clean_env(**extra: str) -> dict:
    """The environment of the fresh venv's processes: nothing that points Python at the checkout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra)
    return env


@dataclass
class Wheel:
    path: Path
    source: Path          # the copy of the checkout it was built from
    log: str              # pip's and setuptools' output


@dataclass
class Installed:
    venv: Path
    python: Path
    site: Path            # the fresh venv's site-packages, where the wheel went
    work: Path            # a folder outside the checkout to run its processes in

    def run(self, args: list, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in args], cwd=self.work, env=_clean_env(**env),
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Wheel:
    """The wheel of the checkout as it is now, built once per test run from a copy of the build's
    inputs (an in-tree build would leave build/ and an egg-info in the checkout, and a stale
    build/lib could slip old files into the wheel)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "checkpoint")
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=skip)
        else:
            shutil.copy2(ROOT / name, src / name)
    # stored, not deflated: the same files, without compressing the zoo's weights (they barely shrink)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "--config-settings=--build-option=--compression=stored",
                           "-v", "-w", str(tmp / "dist"), str(src)],
                          cwd=tmp, env=_clean_env(), capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    [path] = (tmp / "dist").glob("speclab-*.whl")
    return Wheel(path, src, log)


@pytest.fixture(scope="session")
def installed(wheel, tmp_path_factory) -> Installed:
    """`wheel` installed with --no-deps into a fresh venv that borrows this interpreter's
    dependencies (no download), once per test run."""
    tmp = tmp_path_factory.mktemp("installed")
    venv, work = tmp / "venv", tmp / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # installed before the .pth line exists, so pip sees an empty venv, not the checkout's editable speclab
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                           "--no-compile", "-q", str(wheel.path)],
                          cwd=work, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    where = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           cwd=work, env=_clean_env(), capture_output=True, text=True, check=True)
    site_dir = Path(where.stdout.strip())
    ours = [p for p in dict.fromkeys(site.getsitepackages() + [site.getusersitepackages()]) if os.path.isdir(p)]
    (site_dir / "_speclab_test_deps.pth").write_text("".join(f"{p}\n" for p in ours))
    return Installed(venv, python, site_dir, work)


@pytest.fixture(scope="session")
def imported(installed) -> dict:
    """What `import speclab` in the fresh venv reports: where the package and the kernel's source
    are, and whether this CPU runs the kernel."""
    probe = installed.run([installed.python, "-c", "import json, speclab\n"
                           "from speclab.models import kernels\n"
                           "print(json.dumps({'speclab': speclab.__file__, 'kernel_source': str(kernels._SOURCE),"
                           " 'kernel_paths': kernels.supported()}))"])
    assert probe.returncode == 0, f"import speclab fails in the fresh venv:\n{probe.stderr[-4000:]}"
    return json.loads(probe.stdout.strip().splitlines()[-1])


def test_wheel_build_makes_no_data_folder_a_package(wheel):
    """Data folders (the zoo's models, the dashboard's examples) ship as package data: setuptools has
    no 'package would be ignored' / 'data as package' warning for them."""
    for warning in ("would be ignored", "absent from the `packages` configuration", "as data is deprecated"):
        assert warning not in wheel.log, f"the wheel build warns: {warning!r}"


def test_speclab_imports_from_the_wheel_not_the_checkout(installed, imported):
    """`import speclab` in the fresh venv finds the wheel's copy: the checkout's editable finder is not
    active there."""
    where = Path(imported["speclab"]).parent
    assert where == installed.site / "speclab"
    assert where.resolve().is_relative_to(installed.venv.resolve())


def test_every_package_folder_of_the_source_is_installed(wheel, installed):
    """Each folder with an __init__.py under speclab/ (the front ends speclab/widgets and speclab/apps
    too) is in the installed copy, at the same path, with all its modules: setuptools finds the
    packages, and this is the check that it found them all."""
    packages, modules = [], []
    for init in sorted((wheel.source / "speclab").rglob("__init__.py")):
        folder = init.parent.relative_to(wheel.source)
        if not (installed.site / folder / "__init__.py").is_file():
            packages.append(".".join(folder.parts))
        modules += [str(m.relative_to(wheel.source)) for m in sorted(init.parent.glob("*.py"))
                    if not (installed.site / m.relative_to(wheel.source)).is_file()]
    assert {"speclab/widgets", "speclab/apps"} <= {str(p.parent.relative_to(wheel.source))
                                                  for p in (wheel.source / "speclab").rglob("__init__.py")}
    assert not packages, f"not found by [tool.setuptools.packages.find] in pyproject.toml: {', '.join(packages)}"
    assert not modules, f"modules missing from the wheel: {', '.join(modules)}"


def _package_data(source: Path) -> dict[str, list[Path]]:
    """The package data the wheel must hold, by what it is: source paths relative to the checkout."""
    zoo = [p for p in (source / "speclab/zoo").rglob("*") if p.suffix in ZOO_DATA and "checkpoint" not in p.parts]
    found = {"the kernel's source": (source / "speclab/models").glob("*.cpp"), "the zoo": zoo,
             "the prompt sets": (source / "speclab/prompts").glob("*.jsonl"),
             "the training seeds": (source / "speclab/train").glob("*.txt"),
             "the dashboard's examples": (source / "speclab/apps/examples").glob("*.json")}
    return {what: sorted(p.relative_to(source) for p in paths) for what, paths in found.items()}


def test_package_data_is_installed(wheel, installed):
    """The zoo's json / safetensors / txt / jinja, the prompt sets, the training seeds, the kernel's
    .cpp and the dashboard's examples are installed whole (same size as the source)."""
    data = _package_data(wheel.source)
    for what, files in data.items():
        assert files, f"the source has no files for {what}: the test's patterns are out of date"
    assert Path("speclab/models/bf16_linear.cpp") in data["the kernel's source"]
    assert any(p.suffix == ".safetensors" for p in data["the zoo"])
    missing = [f"{what}: {rel}" for what, files in data.items() for rel in files
               if not (installed.site / rel).is_file()
               or (installed.site / rel).stat().st_size != (wheel.source / rel).stat().st_size]
    assert not missing, "missing or different in the installed copy:\n" + "\n".join(missing)


def test_zoo_training_logs_are_not_shipped(installed):
    """The zoo's markdown (training logs) and training checkpoints stay out of the wheel."""
    zoo = installed.site / "speclab" / "zoo"
    assert zoo.is_dir()
    assert not list(zoo.rglob("*.md")) and not list(zoo.rglob("checkpoint"))


def test_console_script_lists_methods(installed):
    """`speclab methods`, the installed console script, runs on the installed copy."""
    done = installed.run([installed.venv / "bin" / "speclab", "methods"])
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].split()[0] == "method" and any(line.split()[:1] == ["ar"] for line in lines), done.stdout


def test_the_installed_copy_decodes_with_its_shipped_zoo(installed):
    """`speclab run` from the installed copy: the zoo's target and draft load from the wheel's own
    data and the run is identical to greedy ar (--check)."""
    done = installed.run([installed.venv / "bin" / "speclab", "run", "--target", "code-target", "--draft",
                          "code-draft", "--method", "draft-model", "--prompt", "def parse(", "--max-new-tokens", "8",
                          "--check", "--json"])
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["identical"] and out["new_tokens"] == 8 and out["guarantee"] == "identical-to-ar"


def test_the_data_package_installs_beside_and_its_parts_resolve_by_name(installed, tmp_path):
    """speclab-zoo's wheel (the SmolLM2 parts), built from its folder and installed beside the core
    wheel: it holds every part's files and nothing else, and the installed speclab finds a part in
    it by name, where before it said how to install it."""
    ask = ("import json; from speclab.models import zoo\ntry: print(json.dumps(zoo.resolve('smollm2-draft')))\n"
           "except zoo.ModelLoadError as e: print(json.dumps(str(e)))")
    before = installed.run([installed.python, "-c", ask])
    assert "pip install ./speclab-zoo" in json.loads(before.stdout.strip().splitlines()[-1]), before.stderr[-2000:]
    src = tmp_path / "src"
    shutil.copytree(ROOT / "speclab-zoo", src, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "checkpoint"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "--config-settings=--build-option=--compression=stored", "-q", "-w", str(tmp_path / "dist"),
                           str(src)], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [whl] = (tmp_path / "dist").glob("speclab_zoo-*.whl")
    import zipfile
    with zipfile.ZipFile(whl) as z:
        names = {n for n in z.namelist() if ".dist-info/" not in n}
    shipped = {str(p) for p in (ROOT / "speclab-zoo").rglob("*") if p.is_file() and p.suffix in ZOO_DATA
               and "checkpoint" not in p.parts and p.parent.name.startswith("smollm2-")}
    assert names == {str(Path(s).relative_to(ROOT / "speclab-zoo")) for s in shipped} | {"speclab_zoo/__init__.py"}
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(installed.python), "install", "--no-deps",
                           "--no-index", "--no-compile", "-q", str(whl)], cwd=installed.work, env=_clean_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    after = installed.run([installed.python, "-c", ask])
    where = Path(json.loads(after.stdout.strip().splitlines()[-1]))
    assert where.resolve().is_relative_to(installed.site.resolve()) and (where / "model.safetensors").is_file()


def test_installed_kernel_source_is_where_kernels_looks(installed, imported):
    """speclab.models.kernels builds bf16_linear.cpp from beside itself: that file is installed."""
    source = Path(imported["kernel_source"])
    assert source == installed.site / "speclab" / "models" / "bf16_linear.cpp"
    assert source.is_file()


KERNEL_CHECK = """
import json, warnings, torch
from speclab.models import kernels
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    mod = kernels.module()
out = {"file": mod and mod.__file__, "warnings": [str(w.message) for w in caught]}
if mod is not None:
    torch.manual_seed(0)
    W, x = torch.randn(100, 64, dtype=torch.bfloat16), torch.randn(3, 64, dtype=torch.bfloat16)
    y, ref = kernels.Packed(W)(x).float(), x.float() @ W.float().T
    out["shape"], out["err"], out["scale"] = list(y.shape), float((y - ref).abs().max()), float(ref.abs().max())
print(json.dumps(out))
"""


@pytest.mark.slow
def test_installed_kernel_builds_and_runs(installed, imported, tmp_path):
    """The bf16 CPU kernel builds from the installed .cpp and computes a linear layer. It builds into
    a private extensions folder: a build of the same name from another source path would rewrite
    torch's cached build files, and the checkout's next use would build its kernel again."""
    if not imported["kernel_paths"]:
        pytest.skip("no kernel path for this CPU (not x86): speclab does not build its kernel here "
                    "(the installed .cpp is checked by test_installed_kernel_source_is_where_kernels_looks)")
    # torch finds ninja on PATH: the one installed beside this interpreter
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    done = installed.run([installed.python, "-c", KERNEL_CHECK], timeout=900, PATH=path, SPECLAB_KERNELS="1",
                         TORCH_EXTENSIONS_DIR=str(tmp_path / "torch_extensions"))
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["file"], f"the kernel did not build from the installed copy: {out['warnings']}"
    assert Path(out["file"]).is_relative_to(tmp_path)
    assert out["shape"] == [3, 100] and out["err"] <= 0.02 * out["scale"]


COLAB_STANDIN = '''"""A stand-in for Colab's google.colab: what notebook 01's install cell calls."""
'''
COLAB_OUTPUT = '''enabled = False


def enable_custom_widget_manager():
    global enabled
    enabled = True
'''
CELL_RUNNER = '''import json, sys
from IPython.core.interactiveshell import InteractiveShell
nb = json.load(open(sys.argv[1]))
cell = "".join(nb["cells"][1]["source"])
assert "%pip install" in cell, "notebook 01's second cell is not the install cell"
shell = InteractiveShell.instance()
result = shell.run_cell(cell)
if not result.success:
    raise SystemExit(f"the install cell failed: {result.error_before_exec or result.error_in_exec!r}")
import speclab, torch
import google.colab.output as colab_output
from speclab.models.zoo import pick_device
r = speclab.run("code-target", "def parse(", "draft-model", draft="code-draft", max_new_tokens=6)
ref = speclab.run("code-target", "def parse(", "ar", max_new_tokens=6)
print(json.dumps({"speclab": speclab.__file__, "torch": torch.__file__, "device": str(pick_device()),
                  "widget_manager": colab_output.enabled, "identical": r.ids == ref.ids}))
'''


def test_notebook_install_cell_installs_the_wheel_on_colab(wheel, tmp_path):
    """Notebook 01's install cell, run by IPython in a fresh venv without speclab, with a stand-in
    google.colab on the path and SPECLAB_SOURCE naming the checkout's wheel: it installs speclab from
    the wheel (pip offline: every dependency is already there), keeps the torch that is there, sets
    speclab on the CPU and turns on Colab's widget manager; the installed copy then decodes. (Real
    Colab stays untested: the notebook says so.)"""
    venv, work, standin = tmp_path / "venv", tmp_path / "work", tmp_path / "standin"
    work.mkdir()
    (standin / "google" / "colab").mkdir(parents=True)
    (standin / "google" / "colab" / "__init__.py").write_text(COLAB_STANDIN)
    (standin / "google" / "colab" / "output.py").write_text(COLAB_OUTPUT)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)     # with pip: %pip runs it
    python = venv / "bin" / "python"
    # an old Python's venv brings its own old setuptools, which would shadow ours (torch asks for a newer one)
    subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "setuptools"], env=_clean_env(),
                   capture_output=True, timeout=300)
    where = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           cwd=work, env=_clean_env(), capture_output=True, text=True, check=True)
    site_dir = Path(where.stdout.strip())
    ours = [p for p in dict.fromkeys(site.getsitepackages() + [site.getusersitepackages()]) if os.path.isdir(p)]
    # the checkout's editable speclab is a .pth finder in our site-packages: a .pth line names the folder
    # without running the .pth files inside it, so the fresh venv sees torch & co but no speclab
    (site_dir / "_speclab_test_deps.pth").write_text("".join(f"{p}\n" for p in ours))
    (work / "runner.py").write_text(CELL_RUNNER)
    env = _clean_env(PYTHONPATH=str(standin), SPECLAB_SOURCE=str(wheel.path), PIP_NO_INDEX="1",
                     PIP_DISABLE_PIP_VERSION_CHECK="1", SPECLAB_DEVICE="")
    before = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('speclab'))"],
                            cwd=work, env=env, capture_output=True, text=True)
    assert before.stdout.strip() == "None", "the fresh venv already sees a speclab: the test would prove nothing"
    done = subprocess.run([str(python), "runner.py", str(ROOT / "notebooks" / "01_speculative_sampling.ipynb")],
                          cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(out["speclab"]).resolve().is_relative_to(venv.resolve())          # installed from the wheel
    assert not Path(out["torch"]).resolve().is_relative_to(venv.resolve())        # the torch that was there
    assert out["device"] == "cpu" and out["widget_manager"] and out["identical"]
