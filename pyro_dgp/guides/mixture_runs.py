"""The parts of a :class:`~pyro_dgp.guides.Mixture` run: its record (:class:`MixtureRun`),
the distribution of its ``<layer>.u`` sites (:class:`MixtureInducing`: draws each draw's own
component, scores ``log q(U)`` at the last layer), the messenger that keeps each layer's final
value (:func:`keep_value`), one Gaussian component's ``log q_k(U)`` and the starts taken from
trained guides (:func:`starts_of_guides`), and one trained guide per mode among several
(:func:`one_per_mode`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pyro.distributions as dist
import torch
from pyro.distributions import constraints

from .base import GuideRun, LayerGuide
from .joint import JointGaussian
from .protocol import protocol_of
from .prototype import LayerSite

__all__ = ["MixtureInducing", "MixtureRun", "component_log_q", "keep_value", "one_per_mode",
           "starts_of_guides"]


def component_log_q(component: LayerGuide, values: list[torch.Tensor]) -> torch.Tensor:
    """``(*batch,)`` ``log q_k(U)`` of one Gaussian guide at every layer's value
    ``values[l] (*batch, D_l, M_l)`` (in the model's order), with the parameters' autograd graph.
    A joint guide scores the stacked ``[vec u^1; ...; vec u^L]`` by its joint Gaussian; a guide
    with independent layers sums each layer's ``log q(u^l)``."""
    if isinstance(component, JointGaussian):
        return component.log_q(torch.cat([v.flatten(-2) for v in values], dim=-1))
    total = 0.0
    for site, value in zip(component.layer_sites, values, strict=True):
        g = component.layer_gaussian(site)
        if g.row_trils is not None:  # independent rows: D_l Gaussians over M_l
            rows = dist.MultivariateNormal(g.loc.reshape(site.shape), scale_tril=g.row_trils)
            total = total + rows.log_prob(value).sum(-1)
        else:
            joint = dist.MultivariateNormal(g.loc, scale_tril=g.scale_tril())
            total = total + joint.log_prob(value.flatten(-2))
    return total


@dataclass
class MixtureRun(GuideRun):
    """One run of :class:`Mixture`: each drawing component's own run (``None`` for the others),
    the component of each draw by batch shape, each layer's value per component by layer
    index, and each layer's final value (drawn or replayed) by layer index."""

    runs: list = field(default_factory=list)
    which: dict = field(default_factory=dict)
    component_values: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)


class MixtureInducing(dist.TorchDistribution):
    """``<layer>.u`` of a mixture run: draws the run's components' ``u`` and keeps each draw's
    own component; scores ``0`` but at the last layer, which scores ``log q(U)`` of the run's
    values of every layer (module docstring)."""

    arg_constraints = {}
    support = constraints.real
    has_rsample = True

    def __init__(self, guide, site: LayerSite, run: MixtureRun, batch_shape=()):
        self.guide, self.site, self.run = guide, site, run
        super().__init__(torch.Size(batch_shape), site.shape, validate_args=False)

    def expand(self, batch_shape, _instance=None):
        return MixtureInducing(self.guide, self.site, self.run, batch_shape)

    def rsample(self, sample_shape=torch.Size()):
        if sample_shape:
            raise NotImplementedError("a mixture guide draws through plates, not sample_shape")
        return self.guide.draw_u(self.site, self.run, self.batch_shape)

    def log_prob(self, value):
        if not self.site.is_last:
            return value.new_zeros(value.shape[:-2])
        values = [self.run.values.get(s.index) for s in self.guide.layer_sites]
        values[-1] = value
        if any(v is None for v in values):
            raise ValueError("Mixture: log q(U) needs every layer's u of the run; a layer "
                             "was not sampled before the last")
        return self.guide.log_q(values)


def keep_value(run: MixtureRun, index: int, value) -> None:
    """The last site's ``log q(U)`` reads the final value of layer ``index``."""
    run.values[index] = value


def starts_of_guides(guides, model) -> list[torch.distributions.Distribution]:
    """The joint Gaussian ``q(U)`` (detached) of each guide of ``guides``, a non-empty list of
    trained Gaussian layer guides of ``model`` (``Mixture(init_from=...)``).

    :raises ValueError: naming ``init_from``, for an empty list, a guide that is not a layer
        guide of ``model``, or one without a Gaussian ``q(U)``."""
    if isinstance(guides, LayerGuide) or not isinstance(guides, (list, tuple)) or not guides:
        raise ValueError("Mixture: init_from must be a non-empty list of trained Gaussian "
                         "guides of the model (e.g. [MeanField(model), ...], each fitted), got "
                         f"{type(guides).__name__}")
    starts = []
    for k, guide in enumerate(guides):
        answers = protocol_of(guide)
        if not answers.is_layer_guide or answers.model is not model:
            raise ValueError(f"Mixture: init_from[{k}] ({type(guide).__name__}) is not a layer "
                             "guide of the model this Mixture is built on; pass guides "
                             "trained on that very model object")
        try:
            starts.append(guide.q())
        except NotImplementedError as error:
            raise ValueError(f"Mixture: init_from[{k}] ({type(guide).__name__}) has no Gaussian "
                             f"q(U) to start a component at ({error})") from None
    return starts


def one_per_mode(guides, model, min_kl: float = 100.0) -> list:
    """The first of each group of ``guides`` (trained Gaussian layer guides of ``model``, in
    their order) whose ``q(U)`` lie within ``min_kl`` nats of one another: guide ``k`` is kept
    when the symmetrised KL, ``(KL(q_k || q_j) + KL(q_j || q_k)) / 2``, to every guide kept
    before it exceeds ``min_kl``.

    For ``Mixture(init_from=one_per_mode(fits, model))``: the stratified ELBO's optimal weight
    of a mode grows with the number of distinct components in it, so independent fits that
    landed in the same mode would weigh that mode by how many fits found it, not by its
    posterior mass. On the toys of ``benchmarks/toys.py`` fits of one mode from different
    seeds lie within tens of nats of one another, mirror-image modes hundreds to thousands of
    nats apart (benchmarks/results/history.md); a larger ``q(U)`` (more inducing points or
    layers) spreads both, so check the distances on your own fits.

    :raises ValueError: for a ``min_kl`` that is not positive, and for ``guides`` that
        ``Mixture(init_from=guides)`` refuses (:func:`starts_of_guides`)."""
    if not min_kl > 0:
        raise ValueError(f"one_per_mode: min_kl must be a positive number of nats, got {min_kl}")
    starts = starts_of_guides(guides, model)
    kept: list[int] = []
    for k, q_k in enumerate(starts):
        if all(_symmetrised_kl(q_k, starts[j]) > min_kl for j in kept):
            kept.append(k)
    return [guides[k] for k in kept]


def _symmetrised_kl(p, q) -> float:
    kl = torch.distributions.kl_divergence
    return float(kl(p, q) + kl(q, p)) / 2
