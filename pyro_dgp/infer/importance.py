"""Exact per-draw importance weights for objectives that need them (``RenyiELBO``, IWAE,
``pyro.infer.Importance``).

A guide whose runs draw every ``f`` from the model's own ``p(f | u, f_prev)`` given the run's
``u`` (``per_draw_weights``: ``MeanField(collapsed=False)``, completed autoguides) gives, with
the observation site scored by the DSVI analytic last layer ``E_{N(f; loc, var)} log p(y | f)``,
an unbiased estimate of the usual (Hensman) ELBO, the same objective every other guide
estimates: guides stay comparable on one model. But that run's log-densities do not sum to an
importance weight: the expectation is below ``log p(y | draw) = log int p(y | f) N(f; loc,
var) df`` (Jensen) by an amount that depends on the draw, so ``RenyiELBO`` and ``Importance``
would not tend to ``log p(y)`` as the number of draws grows.

Within :func:`importance_weights` such sites score ``log p(y | draw)`` instead: the exact
weight of the draw, with the last layer integrated out (Rao-Blackwellised). :class:`RenyiELBO`
runs every evaluation inside it; with Pyro's own ``RenyiELBO`` or ``Importance`` use the
context manager. Collapsed guides (the default ``MeanField``, ``Coupled``, ``Chain``) draw
``f`` from ``q(f)``, not given a draw, and are not affected (their runs are not importance
weights at all; ``pyro_dgp.fit`` refuses ``RenyiELBO`` with them).
"""

from __future__ import annotations

import pyro.infer

from ..guides.protocol import protocol_of
from ..likelihoods.marginal import importance_weighting, importance_weights

__all__ = ["RenyiELBO", "check_importance_weights", "importance_weights", "importance_weighting"]


def check_importance_weights(guide) -> None:
    """Refuse a guide whose runs are not importance weights (``per_draw_weights`` false: a
    collapsed ``f``, or ``u`` scored by a closed-form KL): a Renyi or importance-weighted
    bound computed from its runs would not bound ``log p(y)``. Every objective of the package
    that needs per-draw weights calls this; a guide without the attribute (any other Pyro
    guide) is taken as it is. The guide's ``no_weights_reason`` says why (the guide protocol).

    :raises ValueError: naming the guide and the guides to use instead."""
    capabilities = protocol_of(guide)
    if not capabilities.per_draw_weights:
        why = capabilities.no_weights_reason
        raise ValueError(
            f"RenyiELBO needs each draw's importance weight, which {type(guide).__name__} does "
            f"not give ({why}): the result would not be a bound on log p(y). Use "
            "MeanField(model, collapsed=False) (guide 'meanfield-sampled') or a completed "
            "autoguide (guides.complete; 'autonormal', 'automvn', ...), or the ELBO"
        )


class RenyiELBO(pyro.infer.RenyiELBO):
    """Pyro's ``RenyiELBO`` evaluated inside :func:`importance_weights`, so that with a guide
    whose runs are importance weights it is the Renyi bound of the model (Li and Turner 2016,
    Pyro's convention): ``alpha -> 1`` is the ELBO with ``f | u`` integrated inside the log,
    ``alpha = 0`` the importance-weighted bound of Burda et al. 2016, which tends to
    ``log p(y)`` as the number of draws grows; for ``0 < alpha < 1`` it stays below
    ``log p(y)`` whatever the number of draws."""

    def loss(self, model, guide, *args, **kwargs):
        check_importance_weights(guide)
        with importance_weights():
            return super().loss(model, guide, *args, **kwargs)

    def loss_and_grads(self, model, guide, *args, **kwargs):
        check_importance_weights(guide)
        with importance_weights():
            return super().loss_and_grads(model, guide, *args, **kwargs)
