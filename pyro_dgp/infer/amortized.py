"""The objectives of amortized guides over ``S`` weighted paths per point (Meng and Zhang
2024, §4.3-4.6), for :class:`~pyro_dgp.guides.Amortized`:

    ELBO (AR1, AR2, AR2P):  sum_n [ sum_s w_s E_{N(f; m_ns, v_ns)} log p(y_n | f)
                                   - c sum_l sum_s w_s KL(q(u_ns^l) || p(u_ns^l)) ]
    predictive (AR2PP):     sum_n [ log sum_s w_s int p(y_n | f) N(f; m_ns, v_ns) df
                                   - beta c sum_l sum_s w_s KL(...) ]

with ``w = omega`` (the learned quadrature weights) for ``AR2P`` and ``AR2PP`` and ``1/S``
otherwise, ``c`` the layer's KL weight (1, or ``1/N``: ``kl_weight="1/N"``), and the sums
over ``n`` scaled ``N/|B|`` on a minibatch by Pyro's data plate. Where ``u`` is shared by the
paths (AR2) every path carries the same KL, so its weighted sum is that KL once. The
predictive term is the local alpha objective's at ``alpha = 1``
(:meth:`~pyro_dgp.likelihoods.AnalyticObservation.alpha_log_prob`), with weights ``w``.
The paths are a plate at dim -2 of size ``S``
(:data:`~pyro_dgp.guides.families.amortized.PATH_PLATE`) around one run of the guide and the
model. ``AR2P`` and ``AR2PP`` are deterministic given the parameters: the run has no random
draw.
"""

from __future__ import annotations

import torch
from pyro.distributions.util import scale_and_mask
from pyro.poutine.messenger import Messenger
from torch.distributions import kl_divergence

from ..gp.sites import function_site, inducing_site
from ..guides.draws import unmasked
from ..guides.families.amortized import PATH_PLATE
from ..guides.protocol import protocol_of
from ..likelihoods import AnalyticObservation
from ..validation import check_positive_finite, check_positive_int
from .elbo import AnalyticKL_ELBO, LossFromDifferentiable, plated_traces

__all__ = ["AmortizedELBO"]


class _MeanOfInducing(Messenger):
    """Gives each latent ``<layer>.u`` site the mean of its distribution as value, so that
    nothing is drawn there: ``S`` paths of ``q(u_n)`` cost ``S`` times the Gaussian draws of
    a ``(..., N, D_out, M)`` tensor, and the objective never reads them."""

    def _pyro_sample(self, msg):
        if msg["value"] is None and not msg["is_observed"] and inducing_site(msg) is not None:
            msg["value"] = msg["fn"].mean


class AmortizedELBO(LossFromDifferentiable, AnalyticKL_ELBO):
    """The objective of an :class:`~pyro_dgp.guides.Amortized` guide (module docstring) as
    a Pyro loss for ``pyro.infer.SVI`` and ``fit(..., objective=AmortizedELBO())``.

    :param num_paths: S (default: the guide's ``num_paths``).
    :param predictive: the predictive objective (default: where the guide's rule is
        ``AR2PP``). :param beta: the KL weight of the predictive objective (default: the
        guide's ``beta``; 1 in the ELBO).
    """

    def __init__(self, num_paths: int | None = None, predictive: bool | None = None,
                 beta: float | None = None):
        super().__init__(num_particles=1, max_plate_nesting=2)
        self.num_paths = None if num_paths is None else check_positive_int(
            num_paths, "AmortizedELBO: num_paths")
        self.predictive = predictive
        self.beta = None if beta is None else check_positive_finite(beta, "AmortizedELBO: beta")

    def __repr__(self) -> str:
        return (f"AmortizedELBO(num_paths={self.num_paths}, predictive={self.predictive}, "
                f"beta={self.beta})")

    def _settings(self, guide) -> tuple[int, bool, float]:
        S = self.num_paths or guide.num_paths
        if guide.quadrature and S != guide.num_paths:
            raise ValueError(f"AmortizedELBO: rule {guide.rule} has {guide.num_paths} "
                             f"quadrature nodes, so num_paths must be {guide.num_paths}, got {S}")
        predictive = guide.predictive if self.predictive is None else bool(self.predictive)
        beta = self.beta if self.beta is not None else (guide.beta if predictive else 1.0)
        return S, predictive, beta

    def objective(self, model, guide, *args, **kwargs) -> torch.Tensor:
        """The objective (a tensor to differentiate) at one run of the ``S`` paths."""
        if protocol_of(guide).default_objective != "amortized":
            raise TypeError(f"AmortizedELBO needs a pyro_dgp.guides.Amortized guide, got "
                            f"{type(guide).__name__}")
        if not guide.is_set_up:
            guide.setup(*args, **kwargs)  # its parameters, outside the path plate
        S, predictive, beta = self._settings(guide)
        with _MeanOfInducing():
            model_trace, guide_trace = plated_traces(model, guide, PATH_PLATE, S, args, kwargs)
        weights = guide.path_weights()
        if weights is None:  # on the sites' device: no copy from the host in the step
            like = next(site["value"] for site in model_trace.nodes.values()
                        if site["type"] == "sample")
            weights = torch.full((S,), 1.0 / S, dtype=like.dtype, device=like.device)
        data, kl = 0.0, 0.0
        for name, site in model_trace.nodes.items():
            if site["type"] != "sample" or function_site(site) is not None:
                continue
            if site["is_observed"]:
                data = data + self._data_term(site, weights, predictive)
            else:
                kl = kl + self._kl_term(site, guide_trace.nodes[name], weights)
        return data - beta * kl

    def differentiable_loss(self, model, guide, *args, **kwargs) -> torch.Tensor:
        return -self.objective(model, guide, *args, **kwargs)

    @staticmethod
    def _over_paths(t: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """``sum_s w_s t[..., s, n]``: ``t`` without a path dim is the same for every path."""
        S = weights.shape[0]
        w = weights.to(t)
        if t.dim() >= 2 and t.shape[-2] == S:
            return (w.unsqueeze(-1) * t).sum(-2)
        return t

    def _data_term(self, site: dict, weights: torch.Tensor, predictive: bool) -> torch.Tensor:
        fn, y = unmasked(site["fn"]), site["value"]
        S = weights.shape[0]
        if not predictive:
            lp = self._over_paths(fn.log_prob(y), weights)
        else:
            if isinstance(fn, AnalyticObservation):
                a = fn.alpha_log_prob(y, 1.0)  # log int p(y | f) N(f; m, v) df
            else:
                a = fn.log_prob(y)
            a = a.expand(torch.broadcast_shapes(a.shape, (S, 1)))
            lp = torch.logsumexp(weights.to(a).log().unsqueeze(-1) + a, dim=-2)
        return scale_and_mask(lp, site["scale"], site["mask"]).sum()

    def _kl_term(self, site: dict, guide_site: dict, weights: torch.Tensor) -> torch.Tensor:
        try:
            kl = kl_divergence(guide_site["fn"], site["fn"])
        except NotImplementedError:
            if inducing_site(site) is not None:  # its value is q's mean, not a draw
                raise TypeError(
                    f"AmortizedELBO: KL({type(guide_site['fn']).__name__} || "
                    f"{type(site['fn']).__name__}) of the site '{site['name']}' has no closed "
                    "form registered with torch.distributions.kl; the objective needs it"
                ) from None
            kl = guide_site["fn"].log_prob(guide_site["value"]) - site["fn"].log_prob(
                site["value"])
        kl = scale_and_mask(kl, guide_site["scale"], guide_site["mask"])
        if not torch.is_tensor(kl):
            kl = torch.as_tensor(kl)
        return self._over_paths(kl, weights).sum()
