"""What the README and docs/contributing/building.md promise about building agrees with the files that decide it.

The wheels themselves are checked by ``make dist-check`` (CI runs it): built offline from the sdist,
installed where there is no Go, imported and run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

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


def _wheel_arches() -> list[str]:
    """The architectures scripts/wheels.sh builds for (the names of its WHEEL_ARCH case)."""
    script = (ROOT / "scripts" / "wheels.sh").read_text()
    arches = re.findall(r"^    ([a-z0-9_]+)\) deb_arch=", script, re.MULTILINE)
    assert arches, "scripts/wheels.sh lists the architectures it builds for"
    return arches


def _wheel_glibc() -> tuple[str, str]:
    script = (ROOT / "scripts" / "wheels.sh").read_text()
    m = re.search(r"^GLIBC=\$\{MANYLINUX_GLIBC:-(\d+)\.(\d+)\}$", script, re.MULTILINE)
    assert m is not None, "scripts/wheels.sh sets its default glibc"
    return m.group(1), m.group(2)


def test_wheel_tag_in_docs_is_the_one_make_wheels_builds() -> None:
    makefile = (ROOT / "Makefile").read_text()
    major, minor = _wheel_glibc()
    arches = _wheel_arches()
    assert sorted(arches) == ["aarch64", "x86_64"]
    built = {f"manylinux_{major}_{minor}_{arch}" for arch in arches}
    docs = (ROOT / "README.md", ROOT / "docs" / "guide" / "installing.md", BUILDING, ROOT / "docs" / "contributing" / "gpu-testing.md")
    for doc in docs:
        tags = set(re.findall(r"manylinux_\d+_\d+_[a-z0-9_]+", doc.read_text()))
        assert tags <= built, f"{doc.name} names {sorted(tags - built)}, make wheels builds {sorted(built)}"
    # What users read names the wheel of each machine.
    for doc in (ROOT / "README.md", ROOT / "docs" / "guide" / "installing.md"):
        for tag in built:
            assert f"cp312-cp312-{tag}.whl" in doc.read_text(), f"{doc.name} does not name the {tag} wheel"
    assert "scripts/wheels.sh" in makefile and "WHEEL_ARCH=$(WHEEL_ARCH)" in makefile


def test_wheels_and_the_extension_build_know_the_same_machines() -> None:
    """scripts/wheels.sh's architectures are the Linux platforms bindings/cmd/build can build for (its
    linuxTargets, which name the GOARCH and the EXT_SUFFIX triplet of each): adding one in one place
    only fails here."""
    main = (ROOT / "bindings" / "cmd" / "build" / "main.go").read_text()
    body = re.search(r"var linuxTargets = map\[string\]struct\{ goarch, multiarch string \}\{(.*?)\n\}", main, re.DOTALL)
    assert body is not None, "bindings/cmd/build declares linuxTargets"
    targets = dict(re.findall(r'"linux-([a-z0-9_]+)":\s*\{"[a-z0-9]+", "([a-z0-9_]+)-linux-gnu"\}', body.group(1)))
    assert sorted(targets) == sorted(_wheel_arches())
    assert all(triplet == arch for arch, triplet in targets.items()), targets


def test_the_target_platform_reaches_the_build_through_sysconfig() -> None:
    """A cross build names its target in _PYTHON_HOST_PLATFORM, which sysconfig.get_platform() returns:
    setuptools tags the wheel from it and bindings/cmd/build reads it (scripts/wheels.sh)."""
    script = (ROOT / "scripts" / "wheels.sh").read_text()
    assert "export _PYTHON_HOST_PLATFORM=linux-$ARCH" in script
    main = (ROOT / "bindings" / "cmd" / "build" / "main.go").read_text()
    assert '"platform": sysconfig.get_platform()' in main
    code = "import sysconfig; print(sysconfig.get_platform())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "_PYTHON_HOST_PLATFORM": "linux-aarch64"},
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "linux-aarch64"


def test_wheels_refuses_an_architecture_it_does_not_build_for() -> None:
    """Refused before anything is fetched or built."""
    r = subprocess.run(["bash", str(ROOT / "scripts" / "wheels.sh"), sys.executable],
                       env={**os.environ, "WHEEL_ARCH": "riscv64", "PKG_PYTHON": "/nonexistent/python"},
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert "WHEEL_ARCH=riscv64: wheels are built for x86_64 and aarch64" in r.stderr


def test_the_aarch64_check_is_wired_and_its_tests_exist() -> None:
    """make check-aarch64 builds the wheel it checks and runs scripts/check_aarch64.sh, whose quick part of
    the suite (AARCH64_TESTS) names files that exist, for a CPython that a Debian suite it knows has."""
    makefile = (ROOT / "Makefile").read_text()
    script = (ROOT / "scripts" / "check_aarch64.sh").read_text()
    target = re.search(r"^check-aarch64:.*?(?=^\S|\Z)", makefile, re.MULTILINE | re.DOTALL)
    assert target is not None, "the Makefile has check-aarch64"
    assert "WHEEL_ARCH=aarch64" in target.group(0) and "scripts/check_aarch64.sh" in target.group(0)
    default = re.search(r"^AARCH64_PYTHON \?= (\S+)$", makefile, re.MULTILINE)
    assert default is not None
    assert re.search(rf"^    {re.escape(default.group(1))}\) suite=", script, re.MULTILINE), "no Debian suite for the default"
    tests = re.search(r'^AARCH64_TESTS=\$\{AARCH64_TESTS:-(.*?)\}$', script, re.MULTILINE | re.DOTALL)
    assert tests is not None, "scripts/check_aarch64.sh sets its default AARCH64_TESTS"
    words = tests.group(1).replace("\\\n", " ").split()
    files = [w.split("::")[0] for w in words if w.startswith("tests/")]
    assert files and all((ROOT / f).is_file() for f in files), [f for f in files if not (ROOT / f).is_file()]
    # A deselected test is one of the files' own.
    for i, w in enumerate(words[:-1]):
        if w == "--deselect":
            path, name = words[i + 1].split("::")
            assert path in files and f"def {name}(" in (ROOT / path).read_text(), words[i + 1]
    assert "make check-aarch64" in BUILDING.read_text()


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
