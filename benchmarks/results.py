"""Benchmark results as data: one JSON line per measured configuration.

Each benchmark appends ``{"benchmark", "date", "command", "machine", "commit", "settings",
"figures"}`` to ``benchmarks/results/<benchmark>.jsonl`` (``$PYRO_DGP_RESULTS_DIR`` redirects
it; the test suite points it at a temporary folder). ``python benchmarks/report.py`` turns the
files into ``BENCHMARKS.md``: the latest figures per configuration.
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

__all__ = ["read", "record", "results_dir"]

HERE = Path(__file__).resolve().parent


def results_dir() -> Path:
    """Where results are written: ``$PYRO_DGP_RESULTS_DIR``, else ``benchmarks/results``."""
    return Path(os.environ.get("PYRO_DGP_RESULTS_DIR", HERE / "results"))


def _commit() -> dict:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, text=True,
                             capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "pyro_dgp"], cwd=HERE,
                               text=True, capture_output=True, check=True).stdout.strip()
        return {"commit": rev, "dirty": bool(dirty)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": None, "dirty": None}


def _machine() -> dict:
    from machine import cpu_model

    out = {"host": platform.node(), "cpu": cpu_model(), "cores": os.cpu_count(),
           "python": platform.python_version()}
    try:
        import torch

        out["torch"] = torch.__version__
        out["threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            out["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return out


def record(benchmark: str, settings: dict, figures: dict, command: str | None = None) -> dict:
    """Append one result line for ``benchmark``: its ``settings`` (what identifies the
    configuration) and ``figures`` (what was measured); returns the record written."""
    if command is None:
        command = "python " + shlex.join([os.path.relpath(sys.argv[0])] + sys.argv[1:])
    rec = {"benchmark": benchmark,
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "command": command, "machine": _machine(), **_commit(),
           "settings": settings, "figures": figures}
    directory = results_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{benchmark}.jsonl", "a") as fh:  # one write of one line
        fh.write(json.dumps(rec, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return rec


def read(benchmark: str, directory: Path | None = None) -> list[dict]:
    """Every record of ``benchmark``, oldest first."""
    path = (directory or results_dir()) / f"{benchmark}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
