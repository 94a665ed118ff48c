"""The package as released: one version source, the typing marker shipped, a changelog entry
for the version. (`.ci/release-check` builds, checks and installs the wheel and the sdist.)"""

import tomllib
from importlib.metadata import version
from pathlib import Path

import pyro_dgp

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_one_version_source():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "pyro_dgp.__version__"}
    assert version("pyro_dgp") == pyro_dgp.__version__


def test_typing_marker_is_shipped():
    assert (ROOT / "pyro_dgp" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["pyro_dgp"]


def test_changelog_starts_with_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    first = next(line for line in text.splitlines() if line.startswith("## "))
    assert first.split()[1] == pyro_dgp.__version__, first
