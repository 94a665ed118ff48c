"""The distributions of a GP layer's sites: the whitened prior ``N(0, I)`` of ``u``, the
masked ``.f`` site, the guides' per-point Gaussian of ``f`` and the model's lazy conditional."""

from __future__ import annotations

import math

import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.distributions.torch_distribution import MaskedDistribution
from pyro.distributions.util import broadcast_shape

from ..likelihoods.marginal import SourceGaussian, record_source

__all__ = ["CholeskyMVN", "CorrelatedOutputs", "FunctionMarginal", "FunctionPath",
           "LayerConditional", "WhitenedPrior", "drop_data_dim", "masked_out"]


def drop_data_dim(u: torch.Tensor) -> torch.Tensor:
    """``(..., P, 1, D, M) -> (..., P, D, M)``.

    ``u`` lives outside the data plate (dim -1), so under outer plates (particles, predictive
    samples) its batch shape ends in a singleton at the data plate's position; dropping it lines
    ``u`` up with the layer input ``x`` of shape ``(..., P, N, D_in)``.
    """
    if u.dim() <= 2:
        return u
    if u.shape[-3] != 1:
        raise ValueError(
            f"inducing outputs of shape {tuple(u.shape)} have a batch dim at the data plate's "
            "position (-1); plates around a GP layer must use dims <= -2"
        )
    return u.squeeze(-3)


class CholeskyMVN(dist.MultivariateNormal):
    """``N(loc, L L^T)`` given by its lower Cholesky factor ``L``, with ``log det L L^T``
    where the caller has it (:ivar log_det_cov: ``(*b,)`` or ``None``): a factor stored
    unconstrained yields it from the log-diagonal it stores
    (:func:`~pyro_dgp.guides.params.preconditioned_cholesky`), and taking it again from
    ``L.diagonal()`` would cost a zero-filled ``(*b, M, M)`` gradient per step. The KL to
    :class:`WhitenedPrior` reads it.

    :param loc: ``(*b, M)``; :param scale_tril: ``(*b, M, M)`` (batch dims broadcast).
    """

    def __init__(self, loc: torch.Tensor, scale_tril: torch.Tensor,
                 log_det_cov: torch.Tensor | None = None, validate_args=None):
        self.log_det_cov = log_det_cov
        if loc.dim() == 0 or scale_tril.shape != loc.shape + loc.shape[-1:]:
            super().__init__(loc, scale_tril=scale_tril, validate_args=validate_args)
            return
        # loc (*b, M) and scale_tril (*b, M, M) already agree (q(u) of a layer): the state
        # torch's constructor builds, without its Python broadcast of the shapes and without
        # its expanded views (equal to the tensors; each an autograd node)
        self.scale_tril, self.loc = scale_tril, loc
        super(torch.distributions.MultivariateNormal, self).__init__(
            loc.shape[:-1], loc.shape[-1:], validate_args=validate_args)
        self._unbroadcasted_scale_tril = scale_tril

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(CholeskyMVN, _instance)
        new = super().expand(batch_shape, _instance=new)
        new.log_det_cov = (None if self.log_det_cov is None
                           else self.log_det_cov.expand(batch_shape))
        return new

    def half_log_det(self) -> torch.Tensor:
        """``sum log diag L (*b,)``, half of ``log det L L^T``."""
        if self.log_det_cov is not None:
            return 0.5 * self.log_det_cov
        return self._unbroadcasted_scale_tril.diagonal(dim1=-2, dim2=-1).log().sum(-1)


class WhitenedPrior(dist.Independent):
    """``N(0, I)`` over ``(D_out, M)``: a whitened layer's ``p(u)``.

    It is ``Independent(MultivariateNormal(0, I), 1)`` (so code that reads ``.base_dist``
    keeps working), with the log-density and the KL from a multivariate normal in closed form:
    torch's MVN-MVN KL would solve triangular systems against ``I`` and its log_prob would
    factorise ``I`` again at every step.
    """

    def __init__(self, output_dim: int, num_inducing: int, dtype=None, device=None):
        loc = torch.zeros(output_dim, num_inducing, dtype=dtype, device=device)
        eye = torch.eye(num_inducing, dtype=dtype, device=device)
        base = dist.MultivariateNormal(loc, scale_tril=eye.expand(output_dim, -1, -1),
                                       validate_args=False)
        super().__init__(base, 1, validate_args=False)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(WhitenedPrior, _instance)
        return super().expand(batch_shape, _instance=new)

    def log_prob(self, value):
        D, M = self.event_shape
        return -0.5 * value.square().sum((-2, -1)) - 0.5 * D * M * math.log(2 * math.pi)


class _MaskedOut(MaskedDistribution):
    """``fn.mask(False)`` whose zero log-density has the value's dtype: Pyro's is float32
    whatever the value, which ``TraceEnum_ELBO``'s contraction rejects beside float64 terms."""

    def expand(self, batch_shape, _instance=None):
        if _instance is None and torch.Size(batch_shape) == self.batch_shape:
            return self  # Pyro's plates expand every site's distribution to its own shape
        return super().expand(batch_shape, _instance)

    def log_prob(self, value):
        if self._mask is not False:
            return super().log_prob(value)
        shape = broadcast_shape(self.base_dist.batch_shape,
                                value.shape[: value.dim() - self.event_dim])
        return value.new_zeros(()).expand(shape)


def masked_out(fn: dist.TorchDistribution) -> MaskedDistribution:
    """``fn`` with its log-density masked to zero (a ``<layer>.f`` site: the site contract of
    ``docs/design.md``)."""
    return _MaskedOut(fn, False)


class FunctionMarginal(dist.Independent):
    """``N(loc, var)`` per point and output, event shape ``(D_out,)``.

    Each reparameterised draw is recorded with its ``(loc, var)``
    (:func:`~pyro_dgp.likelihoods.marginal.record_source`).
    """

    def __init__(self, loc: torch.Tensor, var: torch.Tensor, given_draw: bool = False,
                 validate_args=None):
        super().__init__(dist.Normal(loc, var.sqrt(), validate_args=False), 1,
                         validate_args=False)
        self.var = var  # kept, rather than recomputed as scale**2 (an extra autograd node)
        self.given_draw = given_draw

    def rsample(self, sample_shape=torch.Size()):
        value = super().rsample(sample_shape)
        if not sample_shape:
            record_source(value, SourceGaussian(self.base_dist.loc, self.var, self.given_draw))
        return value

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) == self.batch_shape:
            # Pyro's plates expand every site's distribution to its own shape: nothing to do
            # (a new instance would take the square root of the variances again)
            return self
        shape = torch.Size(batch_shape) + self.event_shape
        return FunctionMarginal(self.base_dist.loc.expand(shape), self.var.expand(shape),
                                self.given_draw)


class FunctionPath(FunctionMarginal):
    """``f`` drawn jointly over the ``N`` points: one function's values (a sample path).

    Its marginals, log-density and recorded source are those of :class:`FunctionMarginal`
    ``N(loc, var)``; a draw is ``loc + L eps`` with ``L (..., N, N)`` the lower Cholesky factor
    of the covariance of ``f`` over the points (the same for each of the ``D_out`` outputs;
    with ``per_output``, ``L (..., D_out, N, N)``, one per output, for a kernel per output),
    ``eps (..., N, D_out)`` standard normal, so ``diag(L L^T) = var``.
    """

    def __init__(self, loc: torch.Tensor, var: torch.Tensor, scale_tril: torch.Tensor,
                 given_draw: bool = False, validate_args=None, per_output: bool = False):
        super().__init__(loc, var, given_draw)
        self.path_scale_tril = scale_tril
        self.per_output = per_output

    def rsample(self, sample_shape=torch.Size()):
        if sample_shape:
            raise NotImplementedError("FunctionPath draws one path per batch entry")
        loc = self.base_dist.loc
        eps = torch.randn(loc.shape, dtype=loc.dtype, device=loc.device)
        if self.per_output:  # L_d eps_d for each output d
            value = loc + (self.path_scale_tril @ eps.mT.unsqueeze(-1)).squeeze(-1).mT
        else:
            value = loc + self.path_scale_tril @ eps
        record_source(value, SourceGaussian(loc, self.var, self.given_draw))
        return value

    def expand(self, batch_shape, _instance=None):
        shape = torch.Size(batch_shape) + self.event_shape
        return FunctionPath(self.base_dist.loc.expand(shape), self.var.expand(shape),
                            self.path_scale_tril, self.given_draw, per_output=self.per_output)


class CorrelatedOutputs(FunctionMarginal):
    """``f`` at each point with its ``D_out`` outputs correlated: a draw is ``loc + L xi``,
    ``L (..., N, D_out, D_out)`` the lower Cholesky factor of the outputs' covariance at each
    point, ``xi (..., N, D_out)`` standard normal. Its marginals, log-density and recorded
    source are those of :class:`FunctionMarginal` ``N(loc, var)``, ``var = diag(L L^T)``.

    :ivar noise: a dict whose ``"xi"`` is the noise of the latest draw, shared with the
        instances :meth:`expand` makes: the guide that built it conditions the next layer
        on that draw (:mod:`pyro_dgp.guides.joint_collapse`).
    """

    def __init__(self, loc: torch.Tensor, scale_tril: torch.Tensor, given_draw: bool = False,
                 noise: dict | None = None, validate_args=None):
        super().__init__(loc, scale_tril.square().sum(-1), given_draw)
        self.output_scale_tril = scale_tril
        self.noise = {} if noise is None else noise

    def rsample(self, sample_shape=torch.Size()):
        if sample_shape:
            raise NotImplementedError("CorrelatedOutputs draws one value per batch entry")
        loc = self.base_dist.loc
        xi = torch.randn(loc.shape, dtype=loc.dtype, device=loc.device)
        value = loc + (self.output_scale_tril @ xi.unsqueeze(-1)).squeeze(-1)
        self.noise["xi"] = xi
        record_source(value, SourceGaussian(loc, self.var, self.given_draw))
        return value

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) == self.batch_shape:
            return self
        shape = torch.Size(batch_shape) + self.event_shape
        return CorrelatedOutputs(self.base_dist.loc.expand(shape),
                                 self.output_scale_tril.expand(shape + self.event_shape),
                                 self.given_draw, self.noise)


class LayerConditional(dist.TorchDistribution):
    """``p(f | u, x)`` of one layer, computed only when sampled or scored.

    batch shape ``(..., N)``, event shape ``(D_out,)``.
    """

    arg_constraints = {}
    support = constraints.real_vector
    has_rsample = True

    def __init__(self, layer, x: torch.Tensor, u: torch.Tensor, validate_args=None):
        self.layer, self.x, self.u = layer, x, u
        self._marginal = None
        super().__init__(self.batch_shape_of(x, u), torch.Size([layer.output_dim]),
                         validate_args=False)

    @staticmethod
    def batch_shape_of(x: torch.Tensor, u: torch.Tensor) -> torch.Size:
        """``u (..., D_out, M)`` lies outside the data plate: a singleton at its dim."""
        if u.dim() == 2 and x.dim() >= 2:  # one u (training): x's batch shape, no broadcast
            return x.shape[:-1]
        return broadcast_shape(x.shape[:-1], u.shape[:-2] + (1,))

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loc, var)`` of ``f`` given ``u``, each ``(..., N, D_out)``."""
        return self.layer.conditional(self.x, self.u)

    def marginal(self) -> FunctionMarginal:
        if self._marginal is None:
            loc, var = self.moments()
            self._marginal = FunctionMarginal(loc, var, given_draw=True).expand(self.batch_shape)
        return self._marginal

    def rsample(self, sample_shape=torch.Size()):
        return self.marginal().rsample(sample_shape)

    def log_prob(self, value):
        return self.marginal().log_prob(value)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        return type(self)(self.layer, self.x.expand(batch_shape + self.x.shape[-1:]), self.u)
