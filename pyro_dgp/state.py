"""Attributes set for the duration of a block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["swapped"]


@contextlib.contextmanager
def swapped(obj, name: str, value) -> Iterator[object]:
    """Within the block ``obj.<name>`` is ``value``; its previous value is restored after,
    also on an exception. Nested blocks restore in turn. Yields ``obj``."""
    previous = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield obj
    finally:
        setattr(obj, name, previous)
