"""Sphinx configuration of cudacore's API reference (``make docs``; CI builds it with warnings as errors).

The reference is generated from the package's docstrings (numpydoc style, read by napoleon). autodoc
imports ``cudacore``, so the extension must be built first (``make build``, which ``make docs`` runs); no
GPU is needed: importing cudacore opens no driver, and the build sets ``CUDACORE_BACKEND=sim`` anyway.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
os.environ.setdefault("CUDACORE_BACKEND", "sim")

import cudacore

project = "cudacore"
author = "the cudacore authors"
release = cudacore.__version__
version = release

extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
# The reference's pages; the markdown guide stays on GitHub (docs/index.md links both).
exclude_patterns = ["_build"]
root_doc = "index"

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# The package's annotations are strings (``from __future__ import annotations``); names only the type
# checker sees stay as written.
autodoc_typehints_format = "short"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False
# An ``Attributes`` section becomes a field list of the class: the attributes that are properties are
# documented once, as members, rather than a second time as attribute entries.
napoleon_use_ivar = True

html_theme = "alabaster"
html_title = f"cudacore {release} API reference"
html_static_path: list[str] = []
