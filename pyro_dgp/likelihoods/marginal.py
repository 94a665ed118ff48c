"""The hand-off from a guide's ``<layer>.f`` draw to the likelihood: the Gaussian it came from.

A guide draws ``f`` from ``N(loc, var)`` per point and output; where that Gaussian is exact
given everything else the guide drew, the likelihood may score ``E_{N(f; loc, var)} log
p(y | f)`` instead of ``log p(y | f)`` (the analytic last layer of Salimbeni and Deisenroth
2017: same expectation, lower variance). Pyro hands the model only the drawn value (replay
copies values between traces), so the record is keyed by the drawn tensor itself, in a
``torch.utils.weak.WeakIdKeyDictionary``: it lives exactly as long as the draw, and a value
that was not drawn by a guide (a replayed constant, a user's tensor) has none.

Inside :func:`importance_weights` a record made at a guide's own draw of ``u``
(``given_draw``) makes the likelihood score ``log int p(y | f) N(f; loc, var) df = log p(y |
draw)``, the exact importance weight of that draw with the last layer integrated out.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.weak import WeakIdKeyDictionary

__all__ = [
    "SourceGaussian",
    "importance_weighting",
    "importance_weights",
    "record_source",
    "source_of",
]


@dataclass(frozen=True)
class SourceGaussian:
    """``N(loc, var)`` that a draw of ``f`` (shape ``(..., N, D_out)``) came from.

    :ivar loc: ``(..., N, D_out)``; :ivar var: ``(..., N, D_out)``.
    :ivar given_draw: the Gaussian is the model's own ``p(f | u, f_prev)`` at the run's drawn
        ``u`` and inputs (not a collapsed ``q(f)``), so integrating ``p(y | f)`` against it
        gives ``log p(y | draw)``.
    """

    loc: torch.Tensor
    var: torch.Tensor
    given_draw: bool = False


_SOURCES: WeakIdKeyDictionary = WeakIdKeyDictionary()
_IMPORTANCE = [False]


def record_source(value: torch.Tensor, source: SourceGaussian) -> None:
    """Record that ``value`` was drawn from ``source``."""
    _SOURCES[value] = source


def source_of(value: torch.Tensor) -> SourceGaussian | None:
    """The Gaussian ``value`` was drawn from, or ``None`` for a value no guide drew."""
    return _SOURCES.get(value)


@contextlib.contextmanager
def importance_weights() -> Iterator[None]:
    """Within the block, observation sites of runs that draw ``f`` given their own ``u`` score
    ``log p(y | draw)`` (exact importance weights) rather than the ELBO's expectation."""
    previous, _IMPORTANCE[0] = _IMPORTANCE[0], True
    try:
        yield
    finally:
        _IMPORTANCE[0] = previous


def importance_weighting() -> bool:
    """Whether :func:`importance_weights` is active."""
    return _IMPORTANCE[0]
