"""The API reference (docs/reference, built by ``make docs`` in CI) names every public name of cudacore.

The Sphinx build itself, with warnings as errors, is CI's ``make docs``; this test keeps the page list in
step with ``cudacore.__all__``, so a new public name cannot be left out of the reference.
"""

from __future__ import annotations

import re

import cudacore as cc
from docblocks import ROOT


def test_every_public_name_is_in_the_reference() -> None:
    text = (ROOT / "docs" / "reference" / "api.rst").read_text()
    named = set(re.findall(r"^\.\. auto(?:class|function|data):: (\w+)$", text, re.MULTILINE))
    assert set(cc.__all__) - named == set(), "public names missing from docs/reference/api.rst"
    assert named - set(cc.__all__) == set(), "docs/reference/api.rst names what cudacore does not export"


def test_the_build_is_wired_into_ci() -> None:
    assert re.search(r"^make docs\b", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^docs: build docs-venv$", makefile, re.MULTILINE)
    assert "sphinx-build -E -W" in makefile
    pins = (ROOT / "docs" / "reference" / "requirements.txt").read_text()
    assert re.search(r"^Sphinx==\d", pins, re.MULTILINE) and all(
        "==" in line for line in pins.splitlines() if line and not line.startswith("#")
    )
