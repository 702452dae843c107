# Developer entry points. The extension is built by bindings/cmd/build (see its doc comment); `pip install .`
# does the same through setup.py.

# Everything Python runs in a project virtual environment, so a fresh machine needs only Go, gcc and python3.
VENV ?= .venv
BASE_PYTHON ?= $(shell command -v python3)
PYTHON ?= $(VENV)/bin/python
# The CPython 3.12 of pyenv: the GPU machine runs Python 3.12 (docs/gpu-testing.md).
PY312 ?= $(lastword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12))
GO ?= go

.PHONY: venv run build test gotest pytest wheel312 lint typecheck clean

venv: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml Makefile
	$(BASE_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check pybindgen pytest numpy ruff
	# The example notebook's test (nbclient runs it in an ipykernel; matplotlib draws its plot), `make
	# typecheck`, and tests/test_typing.py (mypy --strict and pyright over the documented code; pyright's
	# package bundles the checker and runs it with the machine's node).
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check nbclient nbformat ipykernel matplotlib mypy pyright
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

gotest:
	$(GO) vet ./...
	$(GO) test -race ./...

pytest: build
	PYTHONPATH=python $(PYTHON) -m pytest -q tests

# A cp312 wheel for the GPU machine, into dist/.
wheel312:
	@test -n "$(PY312)" || { echo "no pyenv Python 3.12 found; set PY312=/path/to/python3.12"; exit 1; }
	$(PY312) -m pip wheel --no-deps --wheel-dir dist .

lint: venv
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(VENV)/bin/ruff check python tests bench examples

# mypy over the examples (and so the package's public surface they use); not part of `make test`.
typecheck: build
	$(VENV)/bin/mypy python/cudacore examples

clean:
	rm -rf build dist python/cudacore/_gopy python/*.egg-info *.egg-info $(VENV)
