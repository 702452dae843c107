# Developer entry points. The extension is built by bindings/cmd/build (see its doc comment); `pip install .`
# does the same through setup.py.

PYTHON ?= $(shell command -v python3)
# The CPython 3.12 of pyenv: the GPU machine runs Python 3.12 (shared/gpu-testing.md).
PY312 ?= $(lastword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12))
GO ?= go

.PHONY: build test gotest pytest wheel312 lint clean

# The extension and gopy's Python files, in place in python/cudacore/_gopy (ignored by git).
build:
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

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	@if command -v ruff >/dev/null 2>&1; then ruff check python tests bench; else echo "ruff not installed: skipped"; fi

clean:
	rm -rf build dist python/cudacore/_gopy python/*.egg-info *.egg-info
