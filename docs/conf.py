"""Sphinx configuration of the pyro_dgp documentation site.

Build from the repository root (warnings are errors)::

    python -m sphinx -W -b html docs docs/_build/html

The notebooks (``notebooks/*.py``, jupytext percent sources, reached through the
``docs/notebooks`` link) are executed by myst-nb in their small size and cached by
jupyter-cache in ``docs/.jupyter_cache``, so a rebuild re-runs only the notebooks that changed.
"""

import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # this checkout's pyro_dgp (and models/), installed or not

# --- the notebooks' environment (the executing kernel inherits it) ---------------------------
os.environ.setdefault("PYRO_DGP_NOTEBOOK_SIZE", "small")
# Figures must reach the executed notebook: CI exports MPLBACKEND=Agg, under which plt.show()
# draws nothing, so the kernel gets the inline backend whatever the caller set.
os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
os.environ.setdefault("OMP_NUM_THREADS", "1")
# $PYRO_DGP_DATA may be relative to the repository root (CI: ../shared/data), while Sphinx and
# the kernels run elsewhere (the kernel in docs/notebooks): made absolute against the root.
if os.environ.get("PYRO_DGP_DATA"):
    os.environ["PYRO_DGP_DATA"] = str((ROOT / os.environ["PYRO_DGP_DATA"]).resolve())

from pyro_dgp import __version__  # noqa: E402  (after sys.path)
from pyro_dgp.datasets import find_uci  # noqa: E402

#: notebook 04 reads the UCI set ``boston``; without it the notebook is left out of the build
#: (the gallery page says so, under ``.. only:: not uci_data``) instead of failing it
UCI_NOTEBOOK = "notebooks/04_uci_alpha_objective.py"
HAS_UCI_DATA = find_uci("boston") is not None

# --- project ------------------------------------------------------------------------------------
project = "pyro_dgp"
author = "the pyro_dgp authors"
copyright = "the pyro_dgp authors"  # noqa: A001 (Sphinx's name)
version = release = __version__

extensions = [
    "myst_nb",  # Markdown pages (myst-parser) and the executed notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx_copybutton",
]

source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".py": "myst-nb"}
exclude_patterns = [
    "_build",
    "jupyter_execute",
    ".jupyter_cache",
    "conf.py",
    "notebooks/README.md",  # the repository's own index of the notebooks: docs/notebooks.md here
    "notebooks/.ipynb_checkpoints",
]
if HAS_UCI_DATA:
    tags.add("uci_data")  # noqa: F821 (Sphinx injects ``tags`` into conf.py)
else:
    exclude_patterns.append(UCI_NOTEBOOK)
templates_path = ["_templates"]


def results_label(question: str) -> str:
    """The cross-reference label of a section of the benchmarks page: ``results-`` and the
    heading's GitHub anchor (``How long is a step on GPU?``: ``results-how-long-is-a-step-on-gpu``),
    so that pages and docstrings link a section with ``{ref}`` / ``:ref:``."""
    return "results-" + re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", question.strip().lower()))


def _write_benchmarks_page() -> None:
    """``BENCHMARKS.md`` (written by ``benchmarks/report.py``) as a page of the site.

    Its links name files of the repository outside ``docs/`` (``benchmarks/results/*.jsonl``),
    which are not part of the site: each becomes its path in code. Each section gets the label
    :func:`results_label`. The page is generated into ``docs/_generated/`` (ignored by git) on
    every build, so it always shows the current file.
    """
    text = (ROOT / "BENCHMARKS.md").read_text()
    text = re.sub(r"\[([^\]]*)\]\((benchmarks/[^)]*)\)",
                  lambda m: f"`{m.group(2)}`" if m.group(1).strip("`") == m.group(2)
                  else f"{m.group(1)} (`{m.group(2)}`)", text)
    text = re.sub(r"^## (.+)$", lambda m: f"({results_label(m.group(1))})=\n## {m.group(1)}",
                  text, flags=re.M)
    page = DOCS / "_generated" / "benchmarks.md"
    page.parent.mkdir(exist_ok=True)
    if not page.exists() or page.read_text() != text:  # unchanged: not re-read by Sphinx
        page.write_text(text)


_write_benchmarks_page()

# --- Markdown and notebooks ---------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3
nb_custom_formats = {".py": ["jupytext.reads", {"fmt": "py:percent"}]}
nb_execution_mode = "cache"
nb_execution_cache_path = str(DOCS / ".jupyter_cache")
nb_execution_timeout = 600
nb_execution_raise_on_error = True  # a failing notebook fails the build
nb_execution_show_tb = True
# the guide comparison warns on purpose (notebook 02); stderr is shown, not an error
nb_output_stderr = "show"
nb_merge_streams = True

# --- API reference ------------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"show-inheritance": True}  # members: in the class template
autodoc_member_order = "bysource"
# autodoc's own type hints, merged into each parameter's field (sphinx-autodoc-typehints put a
# field's continuation lines into the next field's type)
autodoc_typehints = "description"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Type hints name torch, Pyro and NumPy classes and private helpers that the reference does not
# document; an unresolved name stays plain text instead of failing the build.
nitpicky = False


# --- HTML ---------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"pyro_dgp {release}"
html_static_path = []


def _register_linked_notebooks(app, env, docnames):
    """Let Markdown links name the notebooks by their path, ``notebooks/01_....py``.

    ``docs/notebooks`` links to the repository's ``notebooks/``, and Sphinx resolves a link's
    target through that link (to ``<root>/notebooks/...``, outside the source folder), where
    it finds no document. Each notebook's resolved path is registered as its document.
    ``Project._path_to_docname`` is Sphinx's own map from a source path to its document name.
    """
    for docname in env.found_docs:
        if docname.startswith("notebooks/"):
            path = Path(env.doc2path(docname))
            env.project._path_to_docname[path.resolve()] = docname


#: a field (``:param x:``, ``:returns:``, ``:raises E:``) that a docstring starts mid-line, after
#: the end of the previous field's sentence (``:param X: (N, D) inputs; :param y: (N,) targets``),
#: or at the start of an indented line
_INLINE_FIELD = re.compile(
    r"(?:(?<=[;.)])\s+|^\s+)(?=:(?:param [^:`]+|returns?|rtype|raises? [\w.]+):(?:\s|$))")
#: one field naming several parameters, ``:param X, y:``, which Sphinx would read as the
#: parameter ``y`` of type ``X,``: written ``X,y``, one name to Sphinx
_SHARED_FIELD = re.compile(r"^(\s*:param )(\w+(?:, \w+)+):")


def _split_fields(app, what, name, obj, options, lines):
    """Render the docstrings' compact field lists as field lists (the source is unchanged):
    a field started mid-line goes on a line of its own, and ``:param X, y:`` is one field."""
    out = []
    for line in lines:
        for k, piece in enumerate(_INLINE_FIELD.split(line)):
            if k == 0 and not piece.strip() and len(_INLINE_FIELD.split(line)) > 1:
                continue  # the indentation before a field that starts the line
            piece = piece.lstrip() if k else piece
            out.append(_SHARED_FIELD.sub(lambda m: m.group(1) + m.group(2).replace(", ", ",")
                                         + ":", piece))
    lines[:] = out


def setup(app):
    app.connect("env-before-read-docs", _register_linked_notebooks)
    app.connect("autodoc-process-docstring", _split_fields)
