"""Tables of diagnostics that print whole.

pandas shortens a wide frame to the terminal's width (``...`` in place of columns), which
hides columns of a per-layer summary or a guide comparison; these tables print every row and
column (``to_string``) and behave as ``pandas.DataFrame`` otherwise.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["WholeTable", "whole"]


class WholeTable(pd.DataFrame):
    """A ``pandas.DataFrame`` whose ``repr`` is its whole ``to_string()``."""

    @property
    def _constructor(self):
        return WholeTable

    def __repr__(self) -> str:
        return self.to_string()


def whole(frame: pd.DataFrame) -> WholeTable:
    """``frame`` as a :class:`WholeTable` (same data and ``attrs``)."""
    out = WholeTable(frame)
    out.attrs = dict(frame.attrs)
    return out
