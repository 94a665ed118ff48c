"""The progress of :func:`~pyro_dgp.fit`: a bar on a terminal, a line every ``k`` steps
elsewhere (a log file, a notebook, CI), where a bar's carriage returns would fill the output
with one copy of the bar per refresh.

The console bar is ``tqdm.std``'s: ``tqdm.auto`` warns (``TqdmWarning: IProgress not
found``) on import in a Jupyter kernel without ``ipywidgets``, and the kernel's output is not
a terminal anyway. (``import pyro`` imports ``tqdm.auto`` itself, for its MCMC progress:
that warning goes with ``ipywidgets`` installed in the kernel's environment.)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from tqdm.std import tqdm

__all__ = ["Progress", "lines_every"]

#: lines a run of ``num_steps`` prints when not on a terminal (about)
LINES_PER_RUN = 10


def lines_every(progress: bool | int, num_steps: int) -> int:
    """Steps between progress lines: ``progress`` itself when it is a number of steps, else
    a tenth of the run."""
    if isinstance(progress, bool):
        return max(num_steps // LINES_PER_RUN, 1)
    return progress


def _on_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):  # a closed or detached stream
        return False


class Progress:
    """The progress display of one run: steps ``initial`` to ``total``.

    :param progress: ``False``: nothing; ``True``: a bar on a terminal, else a line every
        tenth of the run; an ``int`` ``k``: a line every ``k`` steps, terminal or not.
    :param stream: where it goes (default ``sys.stderr``, read at construction).
    """

    def __init__(self, progress: bool | int, total: int, initial: int, desc: str = "SVI",
                 stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled = progress is not False and progress != 0
        self.total, self.desc = total, desc
        self.every = lines_every(progress, total)
        self.bar = None
        if self.enabled and progress is True and _on_terminal(self.stream):
            self.bar = tqdm(total=total, initial=initial, desc=desc, leave=False,
                            file=self.stream)
        self.t0, self.first = time.perf_counter(), initial

    def update(self, steps_done: int, label: dict[str, str] | Callable[[], dict[str, str]]
               ) -> None:
        """After ``steps_done`` steps, ``label`` the figures to show (``{"elbo": "..."}``), or
        a function that returns them, called only at the steps that show them."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            if steps_done % 10 == 1 or steps_done == self.total:
                self.bar.set_postfix(label() if callable(label) else label, refresh=False)
            return
        if steps_done % self.every and steps_done != self.total:
            return
        if callable(label):
            label = label()
        rate = (steps_done - self.first) / max(time.perf_counter() - self.t0, 1e-9)
        shown = ", ".join(f"{k}={v}" for k, v in label.items())
        print(f"{self.desc} step {steps_done}/{self.total}: {shown} ({rate:.1f} steps/s)",
              file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
