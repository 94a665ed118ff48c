"""Where the tests find the UCI files: ``$PYRO_DGP_DATA`` or the user cache, never a download.

A test that needs a set is marked ``@needs_uci("energy")``; without the files it is skipped with
a reason that names the setting. ``.ci/run`` points ``PYRO_DGP_DATA`` at the shared data, so CI
runs them all.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyro_dgp import datasets


def data_root(*names: str) -> Path | None:
    """The folder holding ``uci/<set>/`` for every set in ``names`` (default ``yacht``), looked
    for in ``$PYRO_DGP_DATA`` and the user cache; ``None`` where a set is missing."""
    roots = set()
    for name in names or ("yacht",):
        folder = datasets.find_uci(name)
        if folder is None:
            return None
        parent = folder.parent
        roots.add(parent.parent if parent.name == "uci" else parent)
    return roots.pop() if len(roots) == 1 else None


def skip_reason(*names: str) -> str:
    return (f"UCI {', '.join(names) or 'data'} not found: set {datasets.ENV_VAR} to the folder "
            "holding uci/ (or put the sets in the user cache); the tests never download")


REQUIRE_VAR = "PYRO_DGP_REQUIRE_DATA"
"""Set (to 1) by ``.ci/run``: a missing UCI set fails the run instead of skipping its tests."""


def uci_root_or_skip(*names: str) -> Path:
    """:func:`data_root` of ``names``, or skip the running test (fail it under
    ``$PYRO_DGP_REQUIRE_DATA``)."""
    root = data_root(*names)
    if root is None:
        if os.environ.get(REQUIRE_VAR):
            pytest.fail(f"{skip_reason(*names)} ({REQUIRE_VAR} is set)")
        pytest.skip(skip_reason(*names))
    return root


def needs_uci(*names: str) -> pytest.MarkDecorator:
    """Skip unless the UCI sets ``names`` are found without a download (under
    ``$PYRO_DGP_REQUIRE_DATA``, fail at collection instead)."""
    missing = data_root(*names) is None
    if missing and os.environ.get(REQUIRE_VAR):
        raise RuntimeError(f"{skip_reason(*names)} ({REQUIRE_VAR} is set)")
    return pytest.mark.skipif(missing, reason=skip_reason(*names))
