"""The ``pyro-dgp`` command line: ``demo``, ``fit``, ``evaluate``. The benchmarks are scripts in
the repository's ``benchmarks/`` folder (``python benchmarks/uci.py --help``)."""

from __future__ import annotations

import sys

from ..train.distributed import PeerFailedError
from .parser import build_parser

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError, KeyError, PeerFailedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

