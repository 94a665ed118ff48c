"""The notebooks (``notebooks/*.py``, jupytext percent sources) execute from top to bottom
in their small size, each in under two minutes.

Marked ``notebooks`` and left out of the default run (``pyproject.toml``); ``.ci/run`` runs
them as a step of their own: ``python -m pytest -m notebooks tests/project/test_notebooks.py``. Set
``PYRO_DGP_NOTEBOOK_OUT`` to a folder to keep the executed notebooks (``.ipynb``, with their
figures) there.
"""

import os
import re
import time
from pathlib import Path

import pytest
from uci_data import uci_root_or_skip

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.py"))
#: warnings a notebook shows on purpose (02 demonstrates the guide comparison's)
SHOWN_WARNINGS = {"GuideComparisonWarning"}
#: the acceptance bound of a notebook's small run on the CI machine (2 cores)
LIMIT_S = 120

pytestmark = pytest.mark.notebooks


def test_the_notebooks_are_there():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_executes_in_its_small_size(path, monkeypatch):
    import jupytext  # the dev extra's: missing, the notebooks step fails rather than skips
    import nbclient
    import nbformat

    if "uci" in path.stem:
        monkeypatch.setenv("PYRO_DGP_DATA", str(uci_root_or_skip("boston")))
    monkeypatch.setenv("PYRO_DGP_NOTEBOOK_SIZE", "small")
    # the kernel's figures go into the executed notebook (headless, as Agg)
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = jupytext.read(path)
    client = nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - start
    out = os.environ.get("PYRO_DGP_NOTEBOOK_OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, Path(out) / f"{path.stem}.ipynb")
    figures = sum(1 for cell in notebook.cells if cell.cell_type == "code"
                  for o in cell.get("outputs", []) if "image/png" in o.get("data", {}))
    print(f"{path.stem}: {elapsed:.1f} s, {figures} figures")
    assert figures >= 1, "the notebook rendered no figure"
    stderr = "".join(o.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                     for o in cell.get("outputs", [])
                     if o.get("output_type") == "stream" and o.get("name") == "stderr")
    unexpected = set(re.findall(r"\b(\w*Warning)\b", stderr)) - SHOWN_WARNINGS
    assert not unexpected, f"{path.stem} shows {sorted(unexpected)}:\n{stderr[:3000]}"
    assert elapsed < LIMIT_S, f"{path.stem} took {elapsed:.0f} s in its small size"


def test_jupytext_executes_a_notebook_with_the_dev_extra(tmp_path):
    """``jupytext --execute``, as notebooks/README.md says to run a notebook, works with what
    the ``dev`` extra installs (it needs nbconvert and ipykernel)."""
    import subprocess
    import sys

    header = NOTEBOOKS[0].read_text().split("# %%", 1)[0]  # the notebooks' jupytext header
    source = tmp_path / "tiny.py"
    source.write_text(header + "# %%\nprint(6 * 7)\n")
    done = subprocess.run([sys.executable, "-m", "jupytext", "--to", "ipynb", "--execute",
                           str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "42" in (tmp_path / "tiny.ipynb").read_text()
