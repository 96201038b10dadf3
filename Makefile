# Two commands on a fresh machine with Python >= 3.10 and make:
#   make demo   set up .venv, then serve / run a real decoding on the embedded zoo models
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

.PHONY: demo test setup setup-dev chromium clean train-zoo-ar

$(VENV)/.torch:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_SPEC)
	touch $@

$(VENV)/.base: $(VENV)/.torch pyproject.toml
	$(PIP) install -q -e ".[dashboard,notebook]"
	touch $@

$(VENV)/.dev: $(VENV)/.base
	$(PIP) install -q -e ".[dashboard,notebook,dev]"
	touch $@

setup: $(VENV)/.base
setup-dev: $(VENV)/.dev chromium

chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium >/dev/null; }

PORT ?= 5006

demo: setup
	@echo "== a real decoding on the embedded zoo models (green: accepted drafts, yellow: from the target)"
	$(VENV)/bin/speclab run --target code-target --draft code-draft --method draft-model --k 4 \
	  --prompt "def read_config(path):" --max-new-tokens 64 --check --color always
	@echo "== the dashboard (Ctrl-C to stop)"
	$(VENV)/bin/speclab serve --port $(PORT)

test: setup-dev
	$(PY) -m pytest -q --durations=15

train-zoo-ar: setup
	$(VENV)/bin/speclab train zoo-ar --out zoo-retrained --minutes 100

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
