"""The fenced code blocks of README.md and docs/**/*.md, with their markers (used by test_docs and test_typing).

Every fenced block names its language. ``python`` blocks run and type-check; ``sh`` and ``bash`` blocks run
in bash from the repository root; ``text`` blocks are not code. The python blocks of one file run in order
in one interpreter, as a reader would paste them, so a block may use the names of the blocks before it.

An HTML comment on the line before a block qualifies it:

- ``<!-- docs-test: gpu -->``: needs a GPU (a kernel launch, the GPU machine's tools); run only with
  ``CUDACORE_BACKEND=cuda`` and a device. A later block of the same file must not need its names.
- ``<!-- docs-test: requires cupy torch -->``: needs those modules; skipped (and left out of type
  checking) where one is missing.
- ``<!-- docs-test: sim -->``: needs the simulator (its test hooks); skipped on a GPU machine.
- ``<!-- docs-test: devices N -->``: needs N devices: on the simulator the file's blocks run with N
  simulated devices (``CUDACORE_SIM_DEVICES``); on a GPU machine with fewer, the block is skipped.
- ``<!-- docs-test: skip REASON -->``: a shell block that is not run by the test (for example one that
  runs the test suite itself); the reason is required.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

LANGUAGES = {"python", "sh", "bash", "text"}

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(\S+)(.*?)\s*-->\s*$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the first line of code (after the fence)
    language: str
    code: str
    gpu: bool = False
    requires: list[str] = field(default_factory=list)
    skip: str | None = None
    devices: int = 1  # how many devices the block needs (``<!-- docs-test: devices N -->``)
    sim: bool = False  # the block needs the simulator (``<!-- docs-test: sim -->``)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def missing(self) -> list[str]:
        """The required modules that cannot be imported here."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one markdown file, in order."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j].rstrip() != "```":
            j += 1
        if j == len(lines):
            raise AssertionError(f"{path.relative_to(ROOT)}:{start + 1}: a code block that is never closed")
        block = Block(path, start + 2, m.group(1), "\n".join(lines[start + 1 : j]) + "\n")
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        marker = _MARKER.match(lines[k]) if k >= 0 else None
        if marker:
            kind, rest = marker.group(1), marker.group(2).strip()
            if kind == "gpu":
                block.gpu = True
            elif kind == "requires":
                block.requires = rest.split()
            elif kind == "skip":
                block.skip = rest
            elif kind == "sim":
                block.sim = True
            elif kind == "devices":
                block.devices = int(rest)
            else:
                raise AssertionError(f"{block.where}: unknown docs-test marker {kind!r}")
        out.append(block)
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks(path)]


def python_source(path: Path, include: list[Block]) -> str:
    """The python blocks ``include`` of ``path`` as one module whose line numbers are the markdown file's."""
    out: list[str] = []
    for b in include:
        out.extend([""] * (b.line - 1 - len(out)))
        out.extend(b.code.splitlines())
    return "\n".join(out) + "\n"
