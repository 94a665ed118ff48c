"""The README's quickstart runs as written (fewer steps), with either of its guides; its two
command lines are unchanged; README.md and docs/ link only inside the repository."""

import re
from pathlib import Path

import pytest
from uci_data import needs_uci

README = Path(__file__).resolve().parents[2] / "README.md"


def _quickstart() -> str:
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md: no python block under '## Quickstart'"
    return match.group(1)


@pytest.mark.parametrize("guide", ["MeanField", "AutoMultivariateNormal"])
def test_quickstart_runs(guide, tmp_path, monkeypatch, capsys):
    code = _quickstart()
    assert "num_steps=1500" in code
    code = code.replace("num_steps=1500", "num_steps=30")
    if guide == "AutoMultivariateNormal":  # the commented alternative guide line
        code, n = re.subn(r"\n# (guide = dgp\.complete\(.*)", r"\n\1", code)
        assert n == 1
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 (the README's own code)
    out = capsys.readouterr().out
    assert "nll" in out and "rmse" in out
    assert (tmp_path / "fit.pt").exists()
    assert type(namespace["guide"]).__name__ == ("MeanField" if guide == "MeanField"
                                                 else "Completed")
    assert namespace["pred"].log_prob(namespace["data"].y_test).shape == (
        len(namespace["data"].y_test),)


ROOT = README.parent
# the two command lines of "## Two commands", byte for byte (CI runs the second)
DEMO_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -c .ci/constraints.txt "
    "torch==2.13.0 && pip install -c .ci/constraints.txt -e . && pyro-dgp demo"
)
TEST_COMMAND = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -c .ci/constraints.txt "
    "torch==2.13.0 && pip install -c .ci/constraints.txt -e \".[dev,bench]\" && "
    "python -m pytest -q -n auto"
)


def test_the_two_command_lines_are_unchanged():
    lines = README.read_text().splitlines()
    assert DEMO_COMMAND in lines, "README.md: the setup+demo command line changed"
    assert TEST_COMMAND in lines, "README.md: the setup+tests command line changed"


def _links(text: str) -> list[str]:
    """Targets of inline links and images, without their #anchors (anchor-only links skipped)."""
    return re.findall(r"\]\(\s*<?([^)#\s>]+)", text)


OWN_DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", OWN_DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_links_stay_in_the_repository_and_resolve(path):
    """README.md and docs/*.md: no web address anywhere, no link climbing a folder, and every
    relative link target exists."""
    text = path.read_text()
    assert "http" not in text.lower(), f"{path.name}: a web address"
    root = ROOT.resolve()
    for target in _links(text):
        assert ".." not in Path(target).parts, f"{path.name}: {target} climbs a folder"
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(root), f"{path.name}: {target} leaves the repository"
        assert resolved.exists(), f"{path.name}: {target} does not exist"


def test_readme_links_into_docs_and_benchmarks():
    targets = set(_links(README.read_text()))
    for needed in ("docs/design.md", "docs/maths.md", "docs/likelihoods.md", "BENCHMARKS.md"):
        assert needed in targets, f"README.md: no link to {needed}"


def test_benchmarks_links_stay_in_the_repository_and_resolve():
    path = ROOT / "BENCHMARKS.md"
    text = path.read_text()
    assert "http://" not in text and "https://" not in text, "BENCHMARKS.md: external link"
    for target in _links(text):
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(ROOT.resolve()), f"BENCHMARKS.md: {target} leaves"
        assert resolved.exists(), f"BENCHMARKS.md: {target} does not exist"


def test_one_current_figure_referenced_from_the_design():
    versions = sorted(p.name for p in (ROOT / "docs").glob("compositional_layer_paths*.png"))
    assert versions == ["compositional_layer_paths.png"], versions
    assert "compositional_layer_paths.png" in _links((ROOT / "docs" / "design.md").read_text())


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 100


def _command_lines() -> list[str]:
    text = README.read_text()
    block = text.split("## Command line", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines()]


@needs_uci("energy")
def test_readme_command_lines_run(tmp_path, monkeypatch, capsys):
    """The README's command-line examples, run in-process with 3 steps into a temp folder:
    the data are found through ``$PYRO_DGP_DATA`` (relative or not) after the change of
    directory, and nothing is downloaded."""
    import shlex

    from pyro_dgp.cli import main

    monkeypatch.chdir(tmp_path)
    lines = _command_lines()
    assert [shlex.split(ln)[:2] for ln in lines] == [
        ["pyro-dgp", "demo"], ["pyro-dgp", "fit"], ["pyro-dgp", "evaluate"]]
    for line in lines:
        argv = shlex.split(line)[1:]
        if "--steps" in argv:
            argv[argv.index("--steps") + 1] = "3"
        else:
            argv += ["--steps", "3"] if argv[0] == "demo" else []
        if argv[0] in ("demo", "fit"):
            argv.append("--quiet")
        assert main(argv) == 0, line
    assert (tmp_path / "out" / "energy" / "fit.pt").exists()
    assert list((tmp_path / "out" / "energy" / "plots").glob("*.png"))
    assert (tmp_path / "out" / "demo" / "results.json").exists()
