"""The guide protocol: everything code outside ``pyro_dgp.guides`` may ask of a guide.

Training, prediction, export and diagnostics never test a guide's class or probe it for
attributes. They ask :func:`protocol_of` (``protocol_of(guide).mean_field``, ...), which
answers for any callable:

- a library guide (every :class:`~pyro_dgp.guides.LayerGuide`, completed autoguides
  included) is a :class:`GuideProtocol` and answers for itself: each family overrides the
  defaults below that do not hold for it;
- any other Pyro guide (a bare autoguide, a hand-written function) is wrapped in
  :class:`PlainGuide`, which gives the answers that hold for a guide that knows nothing of
  GP layers.

A new family declares what differs from these defaults; nothing outside ``guides/`` changes
(``docs/write-a-guide.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pyro.poutine.trace_struct import Trace

    from .blocks import GaussianBlocks

__all__ = ["GuideProtocol", "PlainGuide", "protocol_of", "sample_paths", "shared_draws"]

#: why a guide's runs are not importance weights, where its family does not say
NO_WEIGHTS_REASON = ("it draws f from a collapsed marginal, not given the sampled u, or scores "
                     "u by a closed-form KL")


class GuideProtocol:
    """The capabilities a guide declares, each with its default: flags (class attributes, or
    properties where they depend on the guide's settings), methods and contexts. A family
    overrides only what differs for it."""

    #: Whether ``q`` factorises over layers like the prior, so that ``TraceMeanField_ELBO``
    #: (analytic KL; ``AnalyticKL_ELBO``) is exact for it.
    mean_field: bool = False
    #: Whether one run's ``log p(y, u) - log q(u)`` summed over its sites is an importance
    #: weight of that draw: every ``f`` drawn given the run's own ``u``, and every log-density
    #: the site's own (not a closed-form KL); the observation then scores ``log p(y | draw)``
    #: inside :func:`pyro_dgp.importance_weights`. Objectives that are not linear in the
    #: log-weight (``RenyiELBO``) need it; the ELBO does not, and collapsed estimators rely
    #: on that.
    per_draw_weights: bool = False
    #: Why the runs are not importance weights (read where ``per_draw_weights`` is false).
    no_weights_reason: str = NO_WEIGHTS_REASON
    #: Whether the guide's sites score ``log q`` exactly (``False``: a surrogate, as the
    #: semi-implicit guides' ``log q_K``), as the variational Pareto-k diagnostic needs.
    tractable_log_q: bool = True
    #: Whether the family handles layers whose ``u`` is local (one per data point,
    #: ``AmortizedGPLayer``).
    supports_local_inducing: bool = False
    #: Whether the guide runs the model itself under the layer-site contract
    #: (``docs/design.md``): ``model``, ``layer_sites``, ``site``, ``traces``, ``q``...
    is_layer_guide: bool = True

    @property
    def default_objective(self) -> str:
        """The objective ``fit``'s ``"auto"`` trains it with: ``"analytic-kl"``
        (``AnalyticKL_ELBO``) where :attr:`mean_field`, else ``"elbo"`` (``Trace_ELBO``); a
        family with an objective of its own names it (``"amortized"``)."""
        return "analytic-kl" if self.mean_field else "elbo"

    @property
    def num_components(self) -> int | None:
        """The number of components of a mixture guide, whose stratified objectives
        (:mod:`pyro_dgp.infer.mixture`) run each component in turn through its
        ``component(k)``, ``sampled_f()`` and ``mixture_log_weights()``; ``None`` for a guide
        that is no mixture."""
        return None

    @property
    def only_its_objective(self) -> bool:
        """Whether objectives other than :attr:`default_objective` give a biased gradient:
        the guide chooses part of each draw without a reparameterisation (a mixture's
        component, with learned weights), which only its own objective accounts for."""
        return False

    @property
    def model(self):
        """The model the guide was built on (``None`` for a guide that names none)."""
        return None

    @property
    def is_set_up(self) -> bool:
        """Whether the guide's parameters exist, so that a run draws nothing to create them."""
        return True

    @property
    def draws_shared(self) -> bool:
        """Whether runs now draw one ``U`` for all points (inside :meth:`shared_draws`)."""
        return False

    def layers_log_q(self, guide_trace: Trace, num_draws: int) -> torch.Tensor | None:
        """``(S,)`` joint ``log q(u^1, ..., u^L)`` of the ``S = num_draws`` draws of
        ``guide_trace``, for a family whose ``<layer>.u`` sites do not score ``log q``
        themselves; ``None`` (default) where each site's own ``log_prob`` is its ``log q``."""
        return None

    def natural_gradient_blocks(self) -> GaussianBlocks | None:
        """The Gaussian blocks of ``q(u)`` that natural-gradient steps update
        (:class:`~pyro_dgp.guides.blocks.GaussianBlocks`), ``None`` where ``q(u)`` has none."""
        return None

    def export_attrs(self) -> dict[str, str | int]:
        """What the ArviZ export records of the guide (``to_datatree``'s root attributes):
        ``{"guide": its name}``, plus what sets its estimator apart (e.g. ``collapsed``)."""
        return {"guide": type(self).__name__}

    @contextlib.contextmanager
    def weighted_paths(self) -> Iterator[torch.Tensor | None]:
        """Within this context a run's draws (plate at dim -2) are the guide's weighted paths
        where it has them; yields their weights ``(S,)``, or ``None`` (default: i.i.d. draws
        of equal weight)."""
        yield None

    def shared_draws(self) -> contextlib.AbstractContextManager:
        """A context within which each run draws one ``U`` for all data points (default: a
        guide that always does)."""
        return contextlib.nullcontext()

    def sample_paths(self) -> contextlib.AbstractContextManager:
        """A context within which a run's ``<layer>.f`` values are one composition of
        functions per draw; ``TypeError`` for a guide whose draws of ``f`` are the model's."""
        raise TypeError(f"sample paths need a layer guide of pyro_dgp, got "
                        f"{type(self).__name__}")


class PlainGuide(GuideProtocol):
    """The protocol of a guide that is not a library guide (any Pyro guide): it knows no GP
    layers, its sites' log-densities are its own (so its runs are importance weights and its
    ``log q`` is tractable), and it is set up once it has run (a Pyro autoguide) or needs no
    set-up (any other callable)."""

    per_draw_weights = True
    is_layer_guide = False

    def __init__(self, guide):
        self.guide = guide

    @property
    def is_set_up(self) -> bool:
        # a Pyro autoguide builds its parameters from a prototype trace on its first call
        return getattr(self.guide, "prototype_trace", True) is not None

    def export_attrs(self) -> dict[str, str | int]:
        return {"guide": type(self.guide).__name__}

    def sample_paths(self) -> contextlib.AbstractContextManager:
        raise TypeError(f"sample paths need a layer guide of pyro_dgp, got "
                        f"{type(self.guide).__name__}")


def protocol_of(guide) -> GuideProtocol:
    """``guide`` itself where it is a library guide, else its :class:`PlainGuide`."""
    return guide if isinstance(guide, GuideProtocol) else PlainGuide(guide)


def shared_draws(guide) -> contextlib.AbstractContextManager:
    """:meth:`GuideProtocol.shared_draws` of any guide: for a library guide its own context
    (one ``U`` for all points), for any other callable a no-op context."""
    return protocol_of(guide).shared_draws()


def sample_paths(guide) -> contextlib.AbstractContextManager:
    """:meth:`GuideProtocol.sample_paths` of any guide: ``TypeError`` for one that is not a
    library guide (its draws of ``f`` are the model's own)."""
    return protocol_of(guide).sample_paths()
