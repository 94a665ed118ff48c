"""The README's quickstart runs as written (fewer steps), with either of its guides."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


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


DOCS = [README, *sorted((README.parent / "docs").glob("*.md")), README.parent / "BENCHMARKS.md"]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_links_stay_in_the_repository_and_resolve(path):
    text = path.read_text()
    assert "http://" not in text and "https://" not in text, f"{path.name}: external link"
    root = README.parent.resolve()
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        resolved = (path.parent / target).resolve()
        assert resolved.is_relative_to(root), f"{path.name}: {target} leaves the repository"
        assert resolved.exists(), f"{path.name}: {target} does not exist"


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= 100
