"""Attributes and process-wide settings set for the duration of a block."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

__all__ = ["global_setting", "swapped"]


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


@contextlib.contextmanager
def global_setting(get: Callable[[], object], set_: Callable[[object], None],
                   value) -> Iterator[None]:
    """Within the block a process-wide setting is ``value`` (``set_(value)``); the value
    ``get()`` returned before is set again after, also on an exception."""
    previous = get()
    set_(value)
    try:
        yield
    finally:
        set_(previous)
