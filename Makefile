# Developer entry points. The extension is built by bindings/cmd/build (see its doc comment); `pip install .`
# does the same through setup.py.

# Everything Python runs in a project virtual environment, so a fresh machine needs only Go, gcc and python3.
VENV ?= .venv
BASE_PYTHON ?= $(shell command -v python3)
PYTHON ?= $(VENV)/bin/python
# The CPython 3.12 of pyenv: the GPU machine runs Python 3.12 (docs/gpu-testing.md).
PY312 ?= $(lastword $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.12*/bin/python3.12))
GO ?= go

.PHONY: venv run build test gotest pytest wheel312 lint typecheck clean fuzz fault-sweep

venv: $(VENV)/.ready

$(VENV)/.ready: pyproject.toml
	$(BASE_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check pybindgen pytest numpy ruff
	# The example notebook's test (nbclient runs it in an ipykernel) and `make typecheck`.
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check nbclient nbformat ipykernel mypy
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
