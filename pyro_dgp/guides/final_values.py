"""The messenger that hands a guide run each ``<layer>.u`` value once it is final: the run's
own draw, or a value replayed from another trace (Pyro's ``replay`` sets it after the guide's
distribution drew). Guides whose later sites read the earlier layers' values (the semi-implicit
conditionals, the mixture's ``log q(U)`` at the last layer) keep them through it."""

from __future__ import annotations

from collections.abc import Callable

from pyro.poutine.messenger import Messenger

from ..gp.sites import InducingSite, layer_site

__all__ = ["RecordFinalInducing"]


class RecordFinalInducing(Messenger):
    """Calls ``keep(run, layer_index, value)`` for each ``<layer>.u`` site of ``guide``'s
    current run (``guide.current_run()``), after the site's value is final."""

    def __init__(self, guide, keep: Callable):
        super().__init__()
        self.guide, self.keep = guide, keep

    def _pyro_post_sample(self, msg):
        if not isinstance(layer_site(msg), InducingSite):
            return
        run = self.guide.current_run()
        site = self.guide.find_site(msg["name"].rsplit(".", 1)[0])
        if run is not None and site is not None:
            self.keep(run, site.index, msg["value"])
