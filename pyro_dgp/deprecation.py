"""Renamed keywords and values: the old spelling keeps working for one release, with a
:class:`PyroDGPDeprecationWarning` (a ``DeprecationWarning``) that names the new one.

- :func:`renamed_keywords` decorates a function (or method) whose keyword ``old`` is now
  ``new``: ``f(old=v)`` warns and runs as ``f(new=v)``; ``f(old=v, new=w)`` is a ``TypeError``.
  (:func:`~pyro_dgp.errors.user_errors_first` takes the same renames, so that an entry point
  has one wrapper: the warnings inside it keep their ``stacklevel``.)
- :func:`renamed_value` maps an old value of an argument (``objective="meanfield"``) to its
  new spelling, with the same warning.
- :func:`warn_renamed` warns for any other renamed thing (an attribute, a function).

Each warning is attributed to the first caller outside this package (the line of the user's
code that uses the old spelling), however deep inside the package it is issued
(:func:`user_stacklevel`).
"""

from __future__ import annotations

import functools
import inspect
import warnings

__all__ = ["PyroDGPDeprecationWarning", "keyword_renamer", "renamed_keywords", "renamed_value",
           "user_stacklevel", "warn_renamed"]

_PACKAGE = __name__.split(".")[0]


class PyroDGPDeprecationWarning(DeprecationWarning):
    """An old spelling of this package's API: it works for one more release; the message
    names the new spelling."""


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a ``warnings.warn`` in the function calling this one point
    at the first frame outside this package: the user's line, however deep the call."""
    frame, level = inspect.currentframe().f_back, 1  # the caller's own frame: stacklevel 1
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == _PACKAGE:
        frame, level = frame.f_back, level + 1
    return level


def warn_renamed(old: str, new: str) -> None:
    """Warn that ``old`` (how the caller spelled it) is deprecated in favour of ``new``."""
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new}",
                  PyroDGPDeprecationWarning, stacklevel=user_stacklevel())


def keyword_renamer(fn, where: str, renames: dict[str, str]):
    """A function ``(args, kwargs) -> kwargs`` for calls of ``fn``: each keyword ``old`` of
    ``renames`` (``{old: new}``) passed on as ``new``, with a warning; both given (``new`` by
    keyword or by position): ``TypeError``."""
    signature = inspect.signature(fn)

    def rename(args: tuple, kwargs: dict) -> dict:
        for old, new in renames.items():
            if old not in kwargs:
                continue
            if new in kwargs or new in signature.bind_partial(*args).arguments:
                raise TypeError(f"{where}: got both {old}= and {new}=; {old} is the old name "
                                f"of {new}: pass only {new}")
            warn_renamed(f"{where}({old}=...)", f"{where}({new}=...)")
            kwargs[new] = kwargs.pop(old)
        return kwargs

    return rename


def renamed_keywords(where: str, **renames: str):
    """Decorate ``where`` (its name in messages) so that each keyword ``old`` of ``renames``
    (``old="new"``) is passed on as ``new`` (:func:`keyword_renamer`)."""

    def decorate(fn):
        rename = keyword_renamer(fn, where, renames)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **rename(args, kwargs))

        return wrapper

    return decorate


def renamed_value(value, renames: dict, argument: str, where: str):
    """``value``, or its new spelling ``renames[value]`` with a warning where it is an old one
    (``renames`` maps old values to new ones)."""
    if isinstance(value, str) and value in renames:
        new = renames[value]
        warn_renamed(f"{where}({argument}={value!r})", f"{where}({argument}={new!r})")
        return new
    return value
