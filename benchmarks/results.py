"""Benchmark results as data: one JSON line per measured configuration.

A benchmark script calls :func:`record` once per configuration it measured; the line is appended
to ``benchmarks/results/<benchmark>.jsonl`` (``$PYRO_DGP_RESULTS_DIR`` or the ``results_dir``
argument redirect it; the test suite points it at a temporary folder).
``python benchmarks/report.py`` turns the files into ``BENCHMARKS.md``: the latest figures of
each configuration. Standard library only.

The fields of a record:

``benchmark``
    the benchmark's name, also the file's stem (``uci``, ``speed``, ``compositional``, ...).
``command``
    the shell line that measured it (``python benchmarks/uci.py --datasets boston ...``).
``machine``
    where it ran: ``host`` (``platform.node()``), ``arch`` (``platform.machine()``), ``cpu``
    (the CPU model), ``cores`` (logical processors), ``python``, and where torch is importable
    ``torch`` (its version), ``threads`` (torch's intra-op threads), ``gpu`` (the CUDA
    device's name, when one is available) and the versions of :data:`TIMED_LIBRARIES` that are
    installed (``pyro``, ``gpytorch``, ``linear_operator``, ``numpy``). Records copied from the
    earlier log hold the log's own text here (a string), or ``null`` where it gave none.
``date``
    when it was recorded: a UTC ISO timestamp (``2026-11-25T03:58:34+00:00``); a copied record
    holds the date (and time, where given) as the log wrote it.
``session``
    the log's session number, on copied records (``null`` where the log does not say).
``commit``, ``dirty``
    ``git rev-parse --short HEAD`` of the repository, and whether the library or the benchmark
    scripts had uncommitted changes (``git status`` of ``pyro_dgp/`` and ``benchmarks/``,
    results excluded); ``null`` when git is unavailable. ``$PYRO_DGP_COMMIT`` names the commit
    where the tree was copied without its git folder (``dirty`` is then ``false``: the copy was
    made from that commit). A copied record has the commit the log
    names for the run, else ``null``, and ``dirty`` ``null``.
``settings``
    what identifies the configuration (dataset, model, guide, steps, batch, ...): records with
    equal settings measure the same configuration.
``figures``
    what was measured, by name (``test_loglik``, ``rmse``, ``ms_per_step``, ...).
``transcribed``
    on records written here from a run's printed table (a GPU machine whose files did not come
    back): how; the figures are that run's, rounded as it printed them.
``source``, ``source_line``, ``note``
    on records copied from the log only: ``"history.md"``, the line of
    ``benchmarks/results/history.md`` holding the figures, and a remark where the log's
    provenance needs one (several runs merged into one figure, a run made by a scratch script).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from machine import cpu_model

__all__ = ["default_dir", "read", "record"]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def default_dir() -> Path:
    """Where results go: ``$PYRO_DGP_RESULTS_DIR`` if set, else ``benchmarks/results``."""
    return Path(os.environ.get("PYRO_DGP_RESULTS_DIR", HERE / "results"))


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True,
                          check=True, timeout=30).stdout.strip()


def _commit() -> dict:
    if os.environ.get("PYRO_DGP_COMMIT"):  # a copy of the tree without .git (a GPU machine)
        return {"commit": os.environ["PYRO_DGP_COMMIT"], "dirty": False}
    try:
        rev = _git("rev-parse", "--short", "HEAD")
        changes = _git("status", "--porcelain", "--", "pyro_dgp", "benchmarks",
                       ":(exclude)benchmarks/results")
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": rev or None, "dirty": bool(changes)}


def _machine() -> dict:
    out = {"host": platform.node(), "arch": platform.machine(), "cpu": cpu_model(),
           "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch
    except ImportError:
        return out
    out["torch"] = torch.__version__
    out["threads"] = torch.get_num_threads()
    if torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name()
    out.update(_library_versions())
    return out


#: the libraries whose versions a timing depends on (GPyTorch's step, for one, changed with
#: linear_operator), recorded where importable
TIMED_LIBRARIES = ("pyro", "gpytorch", "linear_operator", "numpy")


def _library_versions() -> dict:
    from importlib import metadata

    names = {"pyro": "pyro-ppl", "linear_operator": "linear-operator"}
    out = {}
    for lib in TIMED_LIBRARIES:
        try:
            out[lib] = metadata.version(names.get(lib, lib))
        except metadata.PackageNotFoundError:
            continue
    return out


def _command(command: list[str] | str | None) -> str:
    if command is None:
        script = os.path.relpath(sys.argv[0]) if sys.argv and sys.argv[0] else "-c"
        return "python " + shlex.join([script, *sys.argv[1:]])
    return command if isinstance(command, str) else shlex.join(command)


def record(benchmark: str, settings: dict, figures: dict,
           command: list[str] | str | None = None, results_dir: str | Path | None = None) -> dict:
    """Append one line to ``<results_dir>/<benchmark>.jsonl`` and return the record written.

    ``settings`` identify the configuration, ``figures`` are what was measured (both must be
    JSON-serialisable). ``command`` defaults to this process's command line
    (``python <script> <args>``); a list is joined as a shell line. ``machine``, ``date``,
    ``commit`` and ``dirty`` are filled in here (see the module's docstring). The line is
    written in one call on a file opened for appending, then flushed and synced, so lines of
    concurrent benchmark processes do not interleave.
    """
    rec = {"benchmark": benchmark, "command": _command(command), "machine": _machine(),
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "session": None, **_commit(), "settings": settings, "figures": figures}
    line = json.dumps(rec, sort_keys=True) + "\n"
    directory = Path(results_dir) if results_dir is not None else default_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{benchmark}.jsonl", "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()
        os.fsync(fh.fileno())
    return rec


def read(benchmark: str, results_dir: str | Path | None = None) -> list[dict]:
    """Every record of ``benchmark``, in file order (an absent file reads as none)."""
    directory = Path(results_dir) if results_dir is not None else default_dir()
    path = directory / f"{benchmark}.jsonl"
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
