"""Test configuration: the simulator by default, the real driver when asked.

The backend is chosen once per process, so it is fixed here before cudacore is first used:
``CUDACORE_BACKEND`` from the environment if set (the GPU machine runs with ``CUDACORE_BACKEND=cuda``),
else the simulator. Tests marked ``gpu`` need the real driver and a device; tests marked ``sim`` need the
simulator (fault injection, simulated device shapes). Each skips on the other backend. Both markers are this
suite's own: ``gpu`` is carried out by the plugin's ``cudacore_gpu`` (checked when the test is set up).
"""

from __future__ import annotations

import gc
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("CUDACORE_BACKEND", "sim")

ROOT = Path(__file__).resolve().parent.parent


def _plugin_autoloaded() -> bool:
    """Whether pytest loads cudacore's plugin by its entry point (cudacore installed, autoload on)."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value == "cudacore.pytest_plugin" for ep in importlib.metadata.entry_points(group="pytest11"))


# cudacore's pytest plugin (python/cudacore/pytest_plugin.py) gives the `cudacore_gpu` marker that `gpu`
# stands for here; it is loaded here when the package is not installed. pytester tests the plugin.
pytest_plugins = ["pytester"] + ([] if _plugin_autoloaded() else ["cudacore.pytest_plugin"])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "sim: needs the simulator backend")
    config.addinivalue_line("markers", "gpu: needs a real CUDA GPU (the plugin's cudacore_gpu); skipped otherwise")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    on_sim = os.environ["CUDACORE_BACKEND"] == "sim"
    for item in items:
        if "sim" in item.keywords and not on_sim:
            item.add_marker(pytest.mark.skip(reason="needs the simulator backend"))
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(pytest.mark.cudacore_gpu)


@pytest.fixture(autouse=True)
def _collect_earlier_garbage() -> None:
    """Collect what earlier tests left in reference cycles before each test: a Buffer in a cycle (a frame of a
    caught exception, say) is freed whenever the collector runs, and a test that counts the memory in use
    would otherwise see it leave in the middle."""
    gc.collect()


@pytest.fixture
def dev() -> Iterator[Any]:
    """Device 0; on the simulator, the faults a test injected are cleared after it. Files whose tests need
    more (a memory check, a skip) define their own."""
    import cudacore as cc
    from cudacore import testing

    d = cc.Device(0)
    yield d
    if cc.backend() == "sim":
        testing.clear_faults()


def objects() -> dict[str, int]:
    """How many streams, events, graphs, captures and loaded modules cudacore holds now (for leak checks)."""
    from cudacore import _api

    return json.loads(_api.call(_api.core.StreamObjects))


def rand(n: int, seed: int) -> Any:
    """n random bytes (a uint8 NumPy array), the same for the same seed."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run code in a fresh interpreter (the backend is per process) with extra environment variables."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    full_env.update(env or {})
    # A file rather than -c, so that multiprocessing's spawn can re-import the main module.
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "probe.py"
        script.write_text(code)
        return subprocess.run(
            [sys.executable, str(script)], env=full_env, capture_output=True, text=True, timeout=timeout, check=False
        )


def run_cli(args: list[str], env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``python -m cudacore ARGS`` in a fresh interpreter."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("CUDACORE_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "cudacore", *args], env=full_env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def base(dev: Any) -> Iterator[tuple[dict[str, int], int, int]]:
    """A leak check around the test: the live streams, events, graphs and captures, and the device's
    in_use and pinned_in_use, are back where they started once the test has closed what it made."""
    gc.collect()
    before = objects(), dev.memory_stats()["in_use"], dev.memory_stats()["pinned_in_use"]
    yield before
    gc.collect()
    after = objects(), dev.memory_stats()["in_use"], dev.memory_stats()["pinned_in_use"]
    assert after == before


@pytest.fixture(scope="session")
def wire_examples() -> list[dict]:
    return json.loads((ROOT / "pkg" / "cuda" / "testdata" / "wire_examples.json").read_text())
