"""What the README and docs/contributing/building.md promise about building agrees with the files that decide it.

The wheels themselves are checked by ``make dist-check`` (CI runs it): built offline from the sdist,
installed where there is no Go, imported and run.
"""

from __future__ import annotations

import re

import pytest

from conftest import ROOT

BUILDING = ROOT / "docs" / "contributing" / "building.md"


def _go_mod_minor() -> str:
    """The Go release go.mod requires, as ``1.N``."""
    m = re.search(r"^go (\d+\.\d+)(?:\.\d+)?$", (ROOT / "go.mod").read_text(), re.MULTILINE)
    assert m is not None, "go.mod has a go line"
    return m.group(1)


def _pyproject_field(name: str) -> str:
    m = re.search(rf'^{name} = "([^"]*)"$', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert m is not None, f"pyproject.toml sets {name}"
    return m.group(1)


def test_readme_and_building_state_go_mods_go_version() -> None:
    go = _go_mod_minor()
    readme = (ROOT / "README.md").read_text()
    assert f"Go ({go}+)" in readme
    assert f"Go {go} or newer" in BUILDING.read_text()
    stated = set(re.findall(r"Go \(?(\d+\.\d+)", readme + BUILDING.read_text()))
    assert stated == {go}, f"a Go version other than go.mod's {go} is stated: {sorted(stated)}"


def test_readme_states_requires_python() -> None:
    floor = _pyproject_field("requires-python")
    assert floor.startswith(">="), floor
    assert f"Python {floor[2:]}+" in (ROOT / "README.md").read_text()


def test_license_is_the_apache_license_that_pyproject_names() -> None:
    assert _pyproject_field("license") == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text


def test_wheel_tag_in_docs_is_the_one_make_wheels_builds() -> None:
    makefile = (ROOT / "Makefile").read_text()
    script = (ROOT / "scripts" / "wheels.sh").read_text()
    m = re.search(r"^GLIBC=\$\{MANYLINUX_GLIBC:-(\d+)\.(\d+)\}$", script, re.MULTILINE)
    assert m is not None, "scripts/wheels.sh sets its default glibc"
    tag = f"manylinux_{m.group(1)}_{m.group(2)}_x86_64"
    for doc in (ROOT / "README.md", ROOT / "docs" / "guide" / "installing.md", BUILDING, ROOT / "docs" / "contributing" / "gpu-testing.md"):
        tags = set(re.findall(r"manylinux_\d+_\d+_x86_64", doc.read_text()))
        assert tags == {tag}, f"{doc.name} names {sorted(tags)}, make wheels builds {tag}"
    assert "scripts/wheels.sh" in makefile


def test_metadata_is_complete() -> None:
    """What ``pip show`` and package indexes display: project URLs, an SPDX license expression, and an
    extra for each library cudacore bridges to (issue 31)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert {"Homepage", "Source", "Documentation", "Issues"} <= set(project["urls"])
    # The Documentation link names the docs' index, which is in the repository.
    doc_url = project["urls"]["Documentation"]
    assert doc_url.endswith("/blob/main/docs/index.md") and (ROOT / "docs" / "index.md").is_file()
    assert all(u.startswith("https://") for u in project["urls"].values())
    extras = project["optional-dependencies"]
    assert {"torch", "cupy", "numba", "matplotlib"} <= set(extras)
    assert extras["torch"][0].startswith("torch") and extras["cupy"][0].startswith("cupy")
    assert extras["numba"][0].startswith("numba") and extras["matplotlib"][0].startswith("matplotlib")
