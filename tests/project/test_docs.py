"""The documentation site (``docs/``, Sphinx): every public name is in the API reference, the
site builds with warnings as errors, and its notebook pages show their figures.

The coverage test runs in the default run and needs no Sphinx (it reads the ``.rst`` sources).
The build and the screenshots are marked ``docs`` and left out of the default run
(``pyproject.toml``); ``.ci/run`` runs them as a step of their own:
``python -m pytest -m docs tests/project/test_docs.py`` (the ``docs`` extra installs Sphinx).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
API = DOCS / "api"
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9]*.py"))
#: the packages whose ``__all__`` the API reference covers (``metrics``, ``importance``: the
#: modules ``pyro_dgp.metrics`` and ``pyro_dgp.importance`` name)
PUBLIC = ["pyro_dgp", "pyro_dgp.guides", "pyro_dgp.gp", "pyro_dgp.kernels",
          "pyro_dgp.likelihoods", "pyro_dgp.train", "pyro_dgp.infer", "pyro_dgp.infer.importance",
          "pyro_dgp.prediction", "pyro_dgp.prediction.metrics", "pyro_dgp.diagnostics",
          "pyro_dgp.gold", "pyro_dgp.datasets"]


def documented_names(text: str) -> set[str]:
    """Full names of the objects an ``.rst`` page documents: the targets of ``auto*::``
    directives and the entries of ``autosummary::`` blocks, each read in the current module
    (``currentmodule::`` / ``automodule::``)."""
    names: set[str] = set()
    module = ""
    in_summary = False
    for line in text.splitlines():
        directive = re.match(r"\.\. (\w+)::\s*(\S*)", line)
        if directive:
            kind, target = directive.groups()
            in_summary = kind == "autosummary"
            if kind in ("currentmodule", "module", "automodule"):
                module = target
            if kind.startswith("auto") and target:
                names.add(target if kind == "automodule" or "." in target
                          else f"{module}.{target}")
            continue
        entry = re.match(r"   ~?([\w.]+)\s*$", line)
        if in_summary and entry:
            name = entry.group(1)
            # as autosummary reads it: in the current module, whatever the entry says
            names.add(name if name.startswith(f"{module}.") else f"{module}.{name}")
        elif line.strip() and not line.startswith(" "):
            in_summary = False
    return names


def _resolve(full_name: str):
    """The object a documented full name names (a module, or an attribute of one)."""
    parts = full_name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(full_name)


def test_documented_names_reads_directives_and_summaries():
    text = """Title
=====

.. automodule:: pkg.sub

.. currentmodule:: pkg.sub

.. autosummary::
   :toctree: generated

   alpha

Prose.

.. currentmodule:: pkg

.. autosummary::

   beta

More prose.

   gamma

.. autofunction:: delta
.. autoclass:: other.Epsilon
"""
    assert documented_names(text) == {"pkg.sub", "pkg.sub.alpha", "pkg.beta",
                                      "pkg.delta", "other.Epsilon"}


def test_every_public_name_is_in_the_api_reference():
    """Each name of ``pyro_dgp.__all__`` and of each public subpackage's ``__all__`` is
    documented: under its own full name, or (a re-export) under another name of the same
    object with the same last component; a module by an ``automodule::`` of it."""
    documented = set()
    for page in API.glob("*.rst"):
        documented |= documented_names(page.read_text())
    by_object: dict[int, set[str]] = {}
    for full in documented:
        by_object.setdefault(id(_resolve(full)), set()).add(full.rsplit(".", 1)[-1])
    missing = []
    for modname in PUBLIC:
        module = importlib.import_module(modname)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.ismodule(obj):
                covered = obj.__name__ in documented
            else:
                covered = (f"{modname}.{name}" in documented
                           or name in by_object.get(id(obj), set()))
            if not covered:
                missing.append(f"{modname}.{name}")
    assert not missing, f"not in docs/api/*.rst: {missing}"


def test_the_api_reference_pages_are_in_its_toctree():
    index = (API / "index.rst").read_text()
    for page in API.glob("*.rst"):
        if page.stem != "index":
            assert re.search(rf"^   {page.stem}$", index, re.M), f"{page.name} not in api/index"


# --- measured figures live on the results page only -----------------------------------------

#: the texts that state the contract and the method: the package's docstrings and comments,
#: the site's pages, the README and the notebooks' index
PROSE = sorted([*(ROOT / "pyro_dgp").rglob("*.py"), *DOCS.glob("*.md"), ROOT / "README.md",
                ROOT / "notebooks" / "README.md"])
#: a figure that was measured, not derived: a time, a speed-up, a score, or the date of a run
MEASURED = re.compile("|".join([
    r"\b\d+(?:\.\d+)? ?ms\b",                                    # 23.5 ms
    r"\btook (?:about |up to )?\d",                              # took 0.19 s
    r"\b\d+(?:\.\d+)?(?:x| times) (?:faster|slower|longer|shorter|lower|higher)\b",
    r"\bRMSE (?:of |was )?[-+]?\d",                              # RMSE 0.71
    r"\bNLL (?:of |was )?[-+]?\d",                               # NLL 4.4
    r"\bELBOs? (?:of |was )?[-+]\d",                             # ELBO of -34.5
    r"\blog-likelihood (?:of |by )?[-+]\d",                      # log-likelihood +0.075
    r"\b\d+(?:\.\d+)? nats (?:after|per point late|behind)\b",  # 0.9 nats after 2000 steps
    r"\b\d+(?:\.\d+)? ?MiB (?:larger|smaller)\b",                # 146 MiB larger
    r"\b20\d\d-[01]\d-[0-3]\d\b",                                # 2026-11-26
]))


def measured_figures(text: str) -> list[str]:
    """``line: text`` of each line of ``text`` that quotes a measured figure."""
    return [f"{i}: {line.strip()}" for i, line in enumerate(text.splitlines(), 1)
            if MEASURED.search(line)]


def test_measured_figures_reads_times_scores_and_dates():
    quoted = ("took 0.19 s\na 16.8 ms step\n4 times slower\nRMSE 0.71\ntest NLL 1.07\n"
              "an ELBO of -34.5\ntest log-likelihood +0.075\n0.9 nats after 2000 steps\n"
              "146 MiB larger\n(2026-11-26)")
    assert len(measured_figures(quoted)) == len(quoted.splitlines())
    derived = ("jitter 1e-6\na 300 s timeout\nlog 2 nats\n268 MB per step\nthe 95% interval\n"
               "1 / (2 * 0.01) = 50 nats\nELBO = log Z - KL\nRMSE (se)")
    assert measured_figures(derived) == []


@pytest.mark.parametrize("path", PROSE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_measured_figures_outside_the_results(path):
    """Measured figures are on the results page (``BENCHMARKS.md``, the site's benchmarks
    page) and in ``benchmarks/results/history.md``; docstrings and docs link there."""
    hits = measured_figures(path.read_text(encoding="utf-8"))
    assert not hits, f"{path.relative_to(ROOT)} quotes measured figures (link the results " \
                     "page instead):\n" + "\n".join(hits)


def history_sections_named(text: str) -> list[str]:
    """The sections of ``benchmarks/results/history.md`` a text names, as
    ``history.md``, "Heading" (over line breaks, comment markers and indentation)."""
    flat = re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", text)
    return re.findall(r"history\.md`*,\s+\"([^\"]+)\"", flat)


def test_each_history_section_named_is_a_heading_of_it():
    headings = set(re.findall(r"^##+ (.+?)\s*$",
                              (ROOT / "benchmarks" / "results" / "history.md").read_text(), re.M))
    named = {(path.relative_to(ROOT).as_posix(), name) for path in PROSE
             for name in history_sections_named(path.read_text(encoding="utf-8"))}
    assert named, "no text names a section of history.md"
    missing = sorted((path, name) for path, name in named if name not in headings)
    assert not missing, f"not a heading of benchmarks/results/history.md: {missing}"


# --- the build (marked docs) ----------------------------------------------------------------


def _has_sphinx() -> bool:
    return all(importlib.util.find_spec(m) for m in ("sphinx", "myst_nb", "furo"))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built into a temporary folder with ``-W`` (the notebooks' jupyter-cache in
    ``docs/.jupyter_cache`` is shared with the documented build command)."""
    if not _has_sphinx():
        pytest.skip("Sphinx, myst-nb or furo not installed: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site") / "html"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "-q", "-b", "html",
                           str(DOCS), str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    assert done.returncode == 0, f"the docs build failed:\n{done.stdout[-3000:]}\n" \
                                 f"{done.stderr[-6000:]}"
    return out


def _has_uci_data() -> bool:
    from pyro_dgp.datasets import find_uci

    data = os.environ.get("PYRO_DGP_DATA")
    if data:  # conf.py reads a relative path from the repository root
        data = str((ROOT / data).resolve())
    return find_uci("boston", data) is not None


@pytest.mark.docs
def test_the_site_builds_with_its_pages(site):
    assert (site / "index.html").is_file()
    assert (site / "api" / "generated" / "pyro_dgp.fit.html").is_file()
    for page in ("getting-started", "write-your-own-model", "choose-a-guide", "scale-out",
                 "design", "maths", "likelihoods", "distributed", "_generated/benchmarks"):
        assert (site / f"{page}.html").is_file(), page
    fit_page = (site / "api" / "generated" / "pyro_dgp.fit.html").read_text()
    assert "num_steps" in fit_page and "lr_schedule" in fit_page


@pytest.mark.docs
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_each_notebook_page_shows_a_figure(site, notebook):
    page = site / "notebooks" / f"{notebook.stem}.html"
    if "uci" in notebook.stem and not _has_uci_data():
        assert not page.exists()
        assert "left out of this build" in (site / "notebooks.html").read_text()
        pytest.skip("UCI boston not found: notebook 04 is left out of the site")
    assert page.is_file(), f"{notebook.stem} not rendered"
    html = page.read_text()
    images = re.findall(r"<img [^>]*src=\"([^\"]+\.png)\"", html)
    assert images, f"{notebook.stem}: no figure"
    assert all((page.parent / src).resolve().is_file() for src in images)


def _chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                "google-chrome"))), None)


@pytest.mark.docs
@pytest.mark.parametrize("page", ["index.html", "notebooks/01_custom_model_svi.html"])
def test_a_headless_browser_renders_the_page(site, page, tmp_path):
    """A screenshot of the page is a real picture: a PNG of the window's size whose pixels
    are not one colour (a page that failed to load or style is blank)."""
    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium: apt-get install chromium")
    shot = tmp_path / "page.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--screenshot={shot}", "--window-size=1280,900",
                    (site / page).as_uri()], capture_output=True, timeout=120, check=True)
    keep = os.environ.get("PYRO_DGP_DOCS_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / page.replace("/", "_").replace(".html", ".png"))
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 900)
    assert len(data) > 20_000, f"{page}: a {len(data)}-byte screenshot is nearly blank"
