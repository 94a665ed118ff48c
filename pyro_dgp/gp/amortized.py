"""``AmortizedGPLayer``: a GP layer with input-dependent inducing inputs and local inducing
outputs (amortized variational inference for deep GPs: Meng and Zhang 2024; the model of
Jafrasteh et al. 2022 for one layer).

For each data point ``n`` the layer has its own inducing outputs ``u_n`` (event shape
``(D_out, M)``) at its own inducing inputs ``Z_n = A(x_n)``, given by ``M`` affine maps

    A_m(x) = W_m x + b_m,     W_m (D_in, D_in) initialised to I,  b_m (D_in,) random,

so the initial inducing inputs are noisy copies of the input. ``u_n`` is whitened
(non-centred): ``u_n ~ N(0, I)`` and ``f(Z_n) = m(Z_n) + chol(K(Z_n, Z_n)) u_n``, so its prior
does not depend on ``Z_n``, and ``f_n | u_n ~ p(f(x_n) | f(Z_n))``. Integrating ``u_n`` out
gives ``f_n ~ N(m(x_n), k(x_n, x_n))`` whatever ``Z_n``: the inducing inputs are variational
choices, and a guide may place them at ``A(P(F))`` for a summary ``P`` of the layer's inputs
(the amortization rules of :class:`~pyro_dgp.guides.Amortized`).

Sites (the contract of ``docs/design.md``, with ``u`` local):

- ``<name>.u``: inside the data plate, batch ``(..., N)``, event ``(D_out, M)``, prior
  ``N(0, I)``. Pyro scales it by the plate's ``N / B`` under subsampling. With
  ``kl_weight="1/N"`` it is also scaled by ``1 / N`` (``poutine.scale``, in the model and so in
  every guide that runs the model): the objective of Meng and Zhang 2024 (App. A), whose
  per-point KL terms are averaged over the data, not summed. It is the default: with
  ``"one"``, the ELBO of the model as written, nothing ties the points together (integrating
  ``u_n`` out leaves ``f_n ~ N(m(x_n), k(x_n, x_n))``, independent over ``n``), so its optimum
  explains the targets as noise, as a fit of ``y = sin(2x) + 0.1 eps`` with ``"one"`` does
  (``benchmarks/results/history.md``, "The amortized layer's KL weight").
- ``<name>.f``: inside the data plate, event ``(D_out,)``, ``p(f_n | u_n, x_n)`` at
  ``Z_n = A(x_n)``, masked and lazy as for :class:`~pyro_dgp.GPLayer`.
"""

from __future__ import annotations

from collections.abc import Callable

import pyro
import torch
from pyro import poutine
from pyro.distributions.util import broadcast_shape
from pyro.nn import PyroParam

from ..kernels import Kernel
from ..state import swapped
from .distributions import LayerConditional, masked_out
from .layer import GPLayer, sample_hyperparameters
from .sites import FunctionSite, InducingSite, check_replayed_guide, tag

__all__ = ["AmortizedGPLayer"]

_KL_WEIGHTS = ("one", "1/N")


class AmortizedGPLayer(GPLayer):
    """``output_dim`` GPs with per-point inducing inputs ``A(x_n)`` and local inducing outputs.

    :param input_dim: D_in. :param output_dim: D_out.
    :param num_inducing: M, with the offsets ``b`` drawn from a standard normal; or
    :param inducing_offsets: ``(M, D_in)`` initial offsets ``b_m`` of the affine maps.
    :param kernel: a :class:`~pyro_dgp.kernels.Kernel` over D_in (default ARD RBF).
    :param mean: as for :class:`~pyro_dgp.GPLayer` (Meng and Zhang 2024 use ``"zero"``).
    :param kl_weight: ``"1/N"`` (default: the per-point KL weighted by ``1 / N``, N the data
        plate's size, as in Meng and Zhang 2024, App. A) or ``"one"`` (the ELBO of the model,
        whose optimum fits the targets as noise: module docstring).
    :param train_affine: learn ``W`` and ``b`` (default) or keep them fixed.
    """

    #: its ``u`` lives inside the data plate (one per point): guides must support that
    local_inducing = True

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        num_inducing: int | None = None,
        inducing_offsets: torch.Tensor | None = None,
        kernel: Kernel | None = None,
        mean: str | torch.Tensor | Callable = "zero",
        jitter: float | None = None,
        name: str | None = None,
        kl_weight: str = "1/N",
        train_affine: bool = True,
    ):
        super().__init__(input_dim, output_dim, num_inducing=num_inducing,
                         inducing_points=inducing_offsets, kernel=kernel, mean=mean,
                         whiten=True, jitter=jitter, name=name, train_inducing=train_affine)
        if self.kernel_outputs:
            raise ValueError("AmortizedGPLayer: per-point inducing inputs need a kernel shared "
                             "by the outputs, not one with outputs=")
        if kl_weight not in _KL_WEIGHTS:
            raise ValueError(f"AmortizedGPLayer: kl_weight must be one of {_KL_WEIGHTS}, got "
                             f"{kl_weight!r}")
        self.kl_weight = kl_weight
        b = self._stored_inducing_points()
        W = torch.eye(self.input_dim, dtype=b.dtype, device=b.device)
        W = W.expand(b.shape[-2], -1, -1).clone()
        if train_affine:
            self.affine_weight = PyroParam(W)
        else:
            self.register_buffer("affine_weight", W)
        self._input = None

    @property
    def current_input(self) -> torch.Tensor | None:
        """``(..., N, D_in)``: the layer's input while its ``.u`` site is sampled (guides
        amortize ``q(u_n)`` on it), else ``None``."""
        return self._input

    def inducing_inputs_at(self, p: torch.Tensor) -> torch.Tensor:
        """``Z = A(p)``: ``(..., N, D_in) -> (..., N, M, D_in)``, ``z_nm = W_m p_n + b_m``."""
        W, b = self.affine_weight, self.inducing_points
        return torch.einsum("mij,...nj->...nmi", W, p) + b

    def local_conditional(self, x: torch.Tensor, u_loc: torch.Tensor,
                          u_scale: torch.Tensor | None = None,
                          at: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginals of ``f(x_n)`` given ``u_n`` (``u_scale=None``), or with ``u_n ~
        N(u_loc, S)`` integrated out, at the inducing inputs ``A(at_n)`` (default ``A(x_n)``).

        :param x: ``(..., N, D_in)``; :param at: ``(..., N, D_in)`` broadcastable with ``x``.
        :param u_loc: ``(..., N, D_out, M)`` whitened; :param u_scale: the Cholesky factor of
            ``S``, ``(..., N, D_out, M, M)``, or its standard deviations ``(..., N, D_out, M)``
            where ``S`` is diagonal, or ``None``.
        :returns: ``(loc, var)``, each ``(..., N, D_out)``, the mean function included.
        """
        at = x if at is None else at
        if _per_point(x, u_loc, u_scale, at):
            return self._paths_conditional(x, u_loc, u_scale, at)
        if u_scale is not None and u_scale.dim() == u_loc.dim():
            u_scale = torch.diag_embed(u_scale)
        with self.given_inducing_inputs(self.inducing_inputs_at(at)):
            loc, var = self.conditional(x.unsqueeze(-2), u_loc, u_scale)
        return loc.squeeze(-2), var.squeeze(-2)

    def _paths_conditional(self, x: torch.Tensor, u_loc: torch.Tensor,
                           u_scale: torch.Tensor | None,
                           at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`local_conditional` where each point of ``at (*points, D_in)`` has its own
        ``Z_n = A(at_n)`` and ``q(u_n)`` (``u_loc (*points, D_out, M)``), shared by the ``P``
        paths of ``x (*paths, *points, D_in)`` (AR2, AR2P, AR2PP: ``points = (N,)``, ``P =
        S``; AR1 and the data: ``P = 1``). Each point's ``P`` inputs are the columns of one
        conditional (Salimbeni and Deisenroth 2017, eq. 7-8, whitened): with
        ``L_n = chol(K(Z_n, Z_n))`` and ``a_np = L_n^-1 k(Z_n, x_np)``,

            mean = a_np^T m_n,    var = k(x_np, x_np) - |a_np|^2 + |S_n^T a_np|^2,

        so ``L_n`` is factorised once per point (not once per path) and the products are
        batched ``(M, M) x (M, P)`` ones over the points instead of matrix-vector ones over
        points and paths; a diagonal ``S_n = diag(s_n)`` gives ``|S_n^T a|^2 = (s_n^2)^T
        (a * a)``, with no ``(M, M)`` matrix per output.

        :param u_scale: ``(*points, D_out, M, M)``, ``(*points, D_out, M)`` (diagonal) or
            ``None``. :returns: ``(loc, var)``, each ``(*paths, *points, D_out)``.
        """
        D_in, D_out, M = at.shape[-1], self.output_dim, u_loc.shape[-1]
        points = at.shape[:-1]
        paths = x.shape[:x.dim() - at.dim()]
        n = points.numel()
        columns = x.reshape(-1, n, D_in).transpose(0, 1)  # (n, P, D_in)
        Z = self.inducing_inputs_at(at.reshape(n, D_in))  # (n, M, D_in)
        Kzz, Kzx, kxx = self.kernel.conditional_parts(Z, columns)  # (n,M,M), (n,M,P), (n,P)
        if Kzx is None:  # a white-noise-only kernel
            Kzx = Z.new_zeros(n, M, columns.shape[-2])
        A = torch.linalg.solve_triangular(self.cholesky_of(Kzz), Kzx, upper=False)  # (n, M, P)
        mean = u_loc.reshape(n, D_out, M) @ A  # (n, D_out, P)
        var = (kxx - A.square().sum(-2)).unsqueeze(-2)  # (n, 1, P)
        if u_scale is not None and u_scale.dim() == u_loc.dim():
            var = var + u_scale.reshape(n, D_out, M).square() @ A.square()
        elif u_scale is not None:
            tril = u_scale.reshape(n, D_out, M, M)
            var = var + (tril.mT @ A.unsqueeze(-3)).square().sum(-2)
        # round-off can make the variance slightly negative where x sits on an inducing input
        var = var.clamp_min(torch.finfo(var.dtype).tiny).expand(mean.shape)
        shape = paths + points + (D_out,)
        loc = mean.permute(2, 0, 1).reshape(shape) + self.mean_function(x)
        return loc, var.permute(2, 0, 1).reshape(shape)

    def forward(self, x: torch.Tensor, plate: pyro.plate | None = None,
                inducing_inputs: torch.Tensor | None = None) -> torch.Tensor:
        """Sample ``<name>.u`` (one per point) then ``<name>.f`` at ``x``, both in the plate.

        :param x: ``(..., N, D_in)``. :param plate: the model's data plate (dim -1); a plate
            of size N is made if omitted. :returns: ``f`` of shape ``(..., N, D_out)``.
        """
        if inducing_inputs is not None:
            raise ValueError(f"layer '{self.name}': an AmortizedGPLayer computes its inducing "
                             "inputs from its input; it takes no inducing_inputs")
        b = self._stored_inducing_points()
        if x.dtype != b.dtype or x.device != b.device or x.shape[-1] != self.input_dim:
            raise ValueError(
                f"layer '{self.name}' expects inputs (..., N, {self.input_dim}) of {b.dtype} on "
                f"{b.device}, got {tuple(x.shape)} of {x.dtype} on {x.device}")
        name = self.name
        check_replayed_guide(self, name)
        sample_hyperparameters(self)
        if plate is None:
            plate = pyro.plate(f"{name}.data", x.shape[-2], dim=-1)
        scale = 1.0 / plate.size if self.kl_weight == "1/N" else 1.0
        with plate:
            with swapped(self, "_input", x), poutine.scale(scale=scale):
                u = pyro.sample(f"{name}.u", self.prior(), infer=tag(InducingSite(self)))
            fn = masked_out(LocalConditional(self, x, u))
            return pyro.sample(f"{name}.f", fn, infer=tag(FunctionSite(self, x, u)))


def _per_point(x: torch.Tensor, u_loc: torch.Tensor, u_scale: torch.Tensor | None,
               at: torch.Tensor) -> bool:
    """Whether ``at (*points, D_in)`` are the last dims of ``x (*paths, *points, D_in)`` and
    ``q(u_n)`` has one ``u_loc (*points, D_out, M)`` and ``u_scale`` per point (then
    :meth:`AmortizedGPLayer._paths_conditional` applies)."""
    points = at.shape[:-1]
    return (x.dim() >= at.dim() and x.shape[x.dim() - at.dim():] == at.shape
            and u_loc.shape[:-2] == points
            and (u_scale is None or u_scale.shape[:len(points)] == points))


class LocalConditional(LayerConditional):
    """``p(f_n | u_n, x_n)`` at ``Z_n = A(x_n)``, computed only when sampled or scored.

    batch shape ``(..., N)``, event shape ``(D_out,)``; ``u`` ``(..., N, D_out, M)``."""

    @staticmethod
    def batch_shape_of(x: torch.Tensor, u: torch.Tensor) -> torch.Size:
        return broadcast_shape(x.shape[:-1], u.shape[:-2])  # one u per point

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer.local_conditional(self.x, self.u)
