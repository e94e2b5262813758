# Two entry points (see README): `make demo` and `make test`. Both install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# CPU torch, pinned: an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN ?= torch==2.13.0
PIP_FLAGS ?= --disable-pip-version-check -q

.PHONY: install slurm-deps browser-deps chroots test test-slurm lint typecheck check demo bench clean site-install site-wheel site-cache

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

# Debian's chromium, for the test that opens `fthsdp report`'s page in a real browser
# (tests/test_report_browser.py). As root only, like slurm-deps.
browser-deps:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	else echo "not root: skipping the chromium install (the browser test will be skipped)"; fi

# The Slurm release matrix (22.05 bookworm, 24.11 trixie, 26.05 sid): every release but the host's
# runs in a cached chroot of the Debian suite that ships it (slurm/release_chroot/, built on first
# use under /var/cache/fthsdp/chroots). As root only, like slurm-deps.
RELEASES = $(BIN)/python -m slurm.release_chroot
VERSION ?=

chroots: install slurm-deps
	@if [ "$$(id -u)" != 0 ]; then echo "not root: skipping the Slurm release chroots"; \
	else for v in $$($(RELEASES) others); do $(RELEASES) ensure --version $$v >/dev/null || exit 1; done; fi

# The slurm-marked tests against one release: on the host when it is the host's, else in its chroot.
# MARKS narrows them (`make test` leaves out the `one_release` stories on the other releases).
MARKS ?= slurm
test-slurm: install slurm-deps site-cache
	@test -n "$(VERSION)" || { echo "usage: make test-slurm VERSION=X.Y ($$($(RELEASES) matrix | cut -d' ' -f1 | xargs))" >&2; exit 2; }
	$(RELEASES) run --version $(VERSION) -- $(BIN)/python -m pytest -m "$(MARKS)" --durations=15

# The layer and cycle contracts of .importlinter run with the linters: a new import the wrong way
# between the four parts, or a cycle between sibling modules, fails here.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

typecheck: install
	$(BIN)/mypy

# The developers' fast tier (the README's full command stays `make test`): lint, types, and every
# test that is neither marked `slurm` (needs the dev cluster) nor `slow` (real multi-process runs
# of ten seconds or more: torch/torchft workers, a control job through its polls and graces, kill
# -9 loops; `make test` runs them), on two pytest-xdist workers: most of its time is spent waiting
# on subprocesses. About 3 minutes on the shared 2-core VM (docs/benchmarks.md).
check: lint typecheck
	$(BIN)/python -m pytest -q -m "not slurm and not slow" -n 2 $(PYTEST_ARGS)

# On the host: the fast tier on two workers (as in `check`); then, side by side
# (tests/slow_tiers.py), the tests that start dev clusters or many processes, one at a time (they
# measure stalls and timeouts), and the slurm-marked tests on every other release of the matrix, one
# release after the other, but for the long `one_release` fault stories (slurmctld away, the
# chaos short set, the power losses):
# their Slurm calls (submit, requeue, drain request, status) are the ones the other slurm tests
# make on every release. Both sides mostly wait on dev clusters, so beside each other they take
# about as long as the longer one.
# SERIAL=1 runs them one after the other.
SERIAL ?=
test: install slurm-deps browser-deps lint typecheck chroots site-cache
	$(BIN)/python -m pytest -m "not slurm and not slow" -n 2
	$(BIN)/python tests/slow_tiers.py --python $(BIN)/python --make "$(MAKE)" $(if $(SERIAL),--serial)

# A site install: the project's wheel with its runtime and health extras and the pinned CPU torch,
# in a virtualenv made from a Python every user can run (not the developer's .venv, whose
# interpreter may sit under a 0700 home). Operators point Prolog, Epilog and HealthCheckProgram at
# PREFIX/bin/fthsdp-{prolog,epilog,healthcheck}; users run PREFIX/bin/fthsdp. docs/operators.md,
# "Installing on a site", gives the same steps with a wheel and no checkout.
PREFIX ?= /opt/fthsdp
SITE_PYTHON ?= /usr/bin/python3
WHEEL_DIR ?= build/wheel

site-install:
	@test -x "$(SITE_PYTHON)" || { echo "site-install: $(SITE_PYTHON) not found: set SITE_PYTHON to a Python 3.11+ every user can run" >&2; exit 3; }
	@if ! "$(SITE_PYTHON)" -c 'import ensurepip, venv' 2>/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null; \
	  else echo "site-install: $(SITE_PYTHON) has no venv module: apt-get install python3-venv (as root)" >&2; exit 3; fi; fi
	@test -x "$(PREFIX)/bin/python" || "$(SITE_PYTHON)" -m venv "$(PREFIX)"
	"$(PREFIX)/bin/pip" install $(PIP_FLAGS) --upgrade pip
	rm -rf "$(WHEEL_DIR)" && "$(PREFIX)/bin/pip" wheel $(PIP_FLAGS) --no-deps -w "$(WHEEL_DIR)" .
	"$(PREFIX)/bin/pip" install $(PIP_FLAGS) "$(TORCH_PIN)"
	"$(PREFIX)/bin/pip" install $(PIP_FLAGS) --force-reinstall --no-deps "$$(ls $(WHEEL_DIR)/fthsdp-*.whl)"
	"$(PREFIX)/bin/pip" install $(PIP_FLAGS) "$$(ls $(WHEEL_DIR)/fthsdp-*.whl)[runtime,health]" "$(TORCH_PIN)"
	chmod -R a+rX "$(PREFIX)"
	@echo "installed fthsdp into $(PREFIX): $(PREFIX)/bin/fthsdp, fthsdp-prolog, fthsdp-epilog, fthsdp-healthcheck"

# Only the project's wheel, rebuilt and reinstalled into an existing site install (its
# dependencies unchanged): what the tests' cached site install does when only the sources changed.
site-wheel:
	@test -x "$(PREFIX)/bin/pip" || { echo "site-wheel: no site install at $(PREFIX): run make site-install first" >&2; exit 3; }
	rm -rf "$(WHEEL_DIR)" && "$(PREFIX)/bin/pip" wheel $(PIP_FLAGS) --no-deps -w "$(WHEEL_DIR)" .
	"$(PREFIX)/bin/pip" install $(PIP_FLAGS) --force-reinstall --no-deps "$$(ls $(WHEEL_DIR)/fthsdp-*.whl)"
	chmod -R a+rX "$(PREFIX)"

# The site install the end-to-end tests submit through (tests/site_install.py): made once by
# site-install under /var/cache/fthsdp/site, from a relocated copy of the venv's own interpreter
# that every user and every release chroot can run; only the wheel is redone when sources change.
site-cache: install
	@if [ "$$(id -u)" != 0 ]; then echo "not root: skipping the tests' site install"; \
	else $(BIN)/python tests/site_install.py; fi

# As root: the run is submitted by the job user through the tests' site install (built once).
demo: install slurm-deps
	@if [ "$$(id -u)" = 0 ]; then site=$$($(BIN)/python tests/site_install.py) || exit 3; \
	  $(BIN)/python examples/demo.py --site "$$site"; else $(BIN)/python examples/demo.py; fi

bench: install
	for b in benchmarks/*.py; do case $$b in */__init__.py|*/harness.py|*/report.py) ;; *) $(BIN)/python $$b || exit 1;; esac; done
	$(BIN)/python benchmarks/report.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache benchmarks/results
