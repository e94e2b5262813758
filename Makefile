# Two entry points (see README): `make demo` and `make test`. Both install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU torch, pinned: an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0
PIP_FLAGS ?= --disable-pip-version-check -q

.PHONY: install slurm-deps test lint typecheck unit demo bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: setup.cfg pyproject.toml | $(BIN)/python
	$(BIN)/pip install $(PIP_FLAGS) --upgrade pip
	$(BIN)/pip install $(PIP_FLAGS) "$(TORCH_PIN)"
	$(BIN)/pip install $(PIP_FLAGS) -e ".[runtime,health,plot,dev]" "$(TORCH_PIN)"
	touch $@

install: $(VENV)/.installed

# Slurm and munge from apt, as root; elsewhere the slurm-marked tests say why they skip.
slurm-deps:
	@if command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null; \
	else echo "not root: skipping slurm-wlm/munge install (Slurm tests will be skipped)"; fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

test: install slurm-deps lint typecheck
	$(BIN)/python -m pytest

demo: install slurm-deps
	$(BIN)/python examples/demo.py

bench: install
	for b in benchmarks/*.py; do case $$b in */__init__.py|*/harness.py|*/report.py) ;; *) $(BIN)/python $$b || exit 1;; esac; done
	$(BIN)/python benchmarks/report.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache benchmarks/results
