"""Every docs page that the repository names exists, and every link between the pages lands.

Code comments, tests, scripts and the README cite pages as ``docs/<folder>/<page>.md``; a page moved or
renamed without its citations updated fails here. The markdown pages' own relative links (``[x](../y.md#z)``)
must reach a file, and an anchor must be a heading of that page (GitHub's anchors).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from docblocks import DOCS, ROOT

# A docs path as the repository cites it; a URL's path (``https://host/docs/x.md``) is not one.
_CITED = re.compile(r"(?<![\w/.-])docs/[\w./-]*?\.md\b")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_SKIP = ("vendor/",)


def _files() -> list[Path]:
    """The repository's tracked text files (every file outside hidden folders where git is missing)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
    except (OSError, subprocess.CalledProcessError):
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".git" not in p.parts]
    return [ROOT / n for n in names if not n.startswith(_SKIP) and (ROOT / n).is_file()]


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page (code blocks left out)."""
    out: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#+\s+(.*)", line)):
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def test_every_cited_docs_page_exists() -> None:
    missing = []
    for path in _files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            for m in _CITED.finditer(line):
                if not (ROOT / m.group(0)).is_file():
                    missing.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
    assert not missing, "docs pages cited but missing:\n" + "\n".join(missing)


def test_links_between_pages_land() -> None:
    broken = []
    for page in DOCS:
        fenced = False
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            for m in _LINK.finditer(line):
                target = m.group(1)
                if re.match(r"[a-z]+:", target):
                    continue  # a URL
                file, _, anchor = target.partition("#")
                dest = (page.parent / file).resolve() if file else page
                where = f"{page.relative_to(ROOT)}:{n}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{where} (no such heading)")
    assert not broken, "links that do not land:\n" + "\n".join(broken)


def test_the_checks_see_the_pages() -> None:
    """The guide, the contributors' pages and the index are all read (a glob that found nothing passes)."""
    names = {str(p.relative_to(ROOT)) for p in DOCS}
    assert {"README.md", "docs/index.md", "docs/guide/memory.md", "docs/contributing/design.md"} <= names
