"""The kernel base class, the shared hyperparameter helpers and stationary kernels' base.

:class:`Kernel` fixes the calling convention (see :mod:`pyro_dgp.kernels`);
:func:`positive_hyperparameter`, :func:`matrix_scale` and :func:`pointwise` create and shape
the positive hyperparameters every kernel shares; :class:`Stationary` is a kernel
``variance * g(r)`` of the scaled distance, computed on inputs centred on their mean row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from pyro.nn import PyroModule, PyroParam

from ..constraints import positive
from ..validation import check_positive_int, positive_tensor, unique_name

if TYPE_CHECKING:
    from .combination import Product, Sum

__all__ = ["Kernel", "Stationary", "matrix_scale", "pointwise", "positive_hyperparameter"]


def positive_hyperparameter(kernel: Kernel, name: str, value,
                            ard: bool | None = None) -> torch.Tensor:
    """The initial value of ``kernel``'s hyperparameter ``name``, checked positive and finite:
    a scalar ``()`` for ``ard=None``; else a scalar or ``(D,)``, returned ``(D,)`` (ARD,
    ``ard=True``) or ``()``."""
    label = f"{type(kernel).__name__}: {name}"
    if ard is None:
        return positive_tensor(value, label, scalar=True)
    t = positive_tensor(value, label)
    D = kernel.input_dim
    if t.numel() == 1 and t.dim() <= 1:
        t = t.reshape(())
    elif not ard:
        raise ValueError(f"{label} must be a scalar (ard=False), got shape {tuple(t.shape)}")
    elif t.shape != (D,):
        raise ValueError(f"{label} must be a scalar or of shape ({D},), got shape "
                         f"{tuple(t.shape)}")
    return t.expand(D).clone() if ard else t


def matrix_scale(v: torch.Tensor) -> torch.Tensor:
    """A scalar hyperparameter drawn per sample (a ``PyroSample`` under outer plates) has batch
    shape ``(..., 1)``, its last dim the data plate's singleton; as a factor of ``(..., N, M)``
    matrices it must be ``(..., 1, 1)``."""
    return v.unsqueeze(-1) if v.dim() else v


def pointwise(v: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """A scalar hyperparameter broadcast to ``X``'s points, ``(..., N)``."""
    if v.dim() == 0:  # the common case, without torch.broadcast_shapes' Python overhead
        return v.expand(X.shape[:-1]).to(X.dtype)
    return v.expand(torch.broadcast_shapes(v.shape, X.shape[:-1])).to(X.dtype)


class Kernel(PyroModule):
    """Base class: ``input_dim`` is the size D of the last input dimension."""

    def __init__(self, input_dim: int):
        super().__init__(name=unique_name(type(self).__name__))
        self.input_dim = check_positive_int(input_dim, f"{type(self).__name__}: input_dim")

    def forward(self, X1: torch.Tensor, X2: torch.Tensor | None = None, diag: bool = False):
        raise NotImplementedError

    def conditional_parts(self, Z: torch.Tensor, X: torch.Tensor):
        """``(K_ZZ, K_ZX, diag k(X, X))`` at once, what a GP conditional needs.

        Subclasses read each hyperparameter once here: every read of a ``PyroParam`` is a
        ``pyro.param`` statement through Pyro's effect handlers plus its constraint transform,
        and a fresh autograd node, so three separate kernel calls would triple that work.
        ``K_ZX`` may be ``None``, meaning zero (a ``White`` kernel).
        """
        return self(Z), self(Z, X), self(X, diag=True)

    def _check(self, X: torch.Tensor) -> None:
        if X.dim() < 2 or X.shape[-1] != self.input_dim:
            raise ValueError(
                f"{type(self).__name__} expects inputs of shape (..., N, {self.input_dim}), "
                f"got {tuple(X.shape)}"
            )

    def __add__(self, other: Kernel) -> Sum:
        from .combination import Sum  # the combinations are kernels themselves

        return Sum(self, other)

    def __mul__(self, other: Kernel) -> Product:
        from .combination import Product

        return Product(self, other)


class Stationary(Kernel):
    """A kernel ``variance * g(r)`` of the scaled distance ``r = |x - x'| / lengthscale``.

    ``lengthscale`` is a scalar (isotropic) or ``(D,)`` (ARD, ``ard=True``).

    ``outputs=P`` makes ``P`` kernels of this form with their own hyperparameters (variance
    ``(P,)``, lengthscale ``(P, D)`` or ``(P,)``, all starting from the values given), one per
    output of a GP layer, as GPyTorch's batched kernels do. Their covariances carry a
    dim of size ``P`` before the two point dims: ``(..., P, N, M)`` and, for ``diag=True``,
    ``(..., P, N)``; inputs with batch dims must hold a singleton there, ``(..., 1, N, D)``.
    """

    def __init__(self, input_dim: int, variance=1.0, lengthscale=1.0, ard: bool = True,
                 outputs: int | None = None):
        super().__init__(input_dim)
        variance = positive_hyperparameter(self, "variance", variance)
        lengthscale = positive_hyperparameter(self, "lengthscale", lengthscale, bool(ard))
        self.outputs = None
        if outputs is not None:
            self.outputs = check_positive_int(outputs, f"{type(self).__name__}: outputs")
            variance = variance.expand(self.outputs).clone()
            lengthscale = lengthscale.expand((self.outputs,) + lengthscale.shape).clone()
        self.variance = PyroParam(variance, positive)
        self.lengthscale = PyroParam(lengthscale, positive)

    def _hyperparameters(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(variance, lengthscale)`` read once each and shaped for ``(..., N, D)`` inputs;
        with ``outputs=P``: ``(P, 1)`` (a batched scalar to :func:`matrix_scale` and
        :func:`pointwise`) and ``(P, 1, D)`` or ``(P, 1, 1)``."""
        var, ls = self.variance, self.lengthscale
        if self.outputs is None:
            return var, ls
        ls = ls.unsqueeze(-2) if ls.dim() == 2 else ls[:, None, None]
        return var.unsqueeze(-1), ls

    #: compute distances directly instead of by ``|a|^2 + |b|^2 - 2 a.b`` (see ``_scaled_sqdist``)
    exact_distance = False

    def _scaled_sqdist(self, X1: torch.Tensor, X2: torch.Tensor, ls) -> torch.Tensor:
        return self._sqdist(*_centred(X1 / ls, X2 / ls))

    def _sqdist(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        """Squared distances between rows of inputs already divided by the lengthscales."""
        if self.exact_distance:
            # The expansion's cancellation error (~eps |a|^2) reaches exp(-r) at first order
            # through the square root; cdist without the matmul trick is exact near r = 0.
            batch = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
            A, B = A.expand(batch + A.shape[-2:]), B.expand(batch + B.shape[-2:])
            return torch.cdist(A, B, compute_mode="donot_use_mm_for_euclid_dist").square()
        # |a - b|^2 = |a|^2 + |b|^2 - 2 a.b: one matmul, no (N, M, D) difference tensor; the
        # cancellation error enters smooth kernels (RBF, Matern 3/2, 5/2) at second order only.
        d2 = (A * A).sum(-1, keepdim=True) + (B * B).sum(-1).unsqueeze(-2) - 2 * A @ B.mT
        return d2.clamp_min(0)

    def profile(self, r2: torch.Tensor) -> torch.Tensor:
        """g as a function of the squared scaled distance."""
        raise NotImplementedError

    def forward(self, X1, X2=None, diag=False):
        self._check(X1)
        var, ls = self._hyperparameters()
        if diag:
            return pointwise(var, X1)
        if X2 is None:
            X2 = X1
        else:
            self._check(X2)
        return matrix_scale(var) * self.profile(self._scaled_sqdist(X1, X2, ls))

    def conditional_parts(self, Z, X):
        if type(self).forward is not Stationary.forward:  # a subclass with its own forward
            return super().conditional_parts(Z, X)
        self._check(Z)
        self._check(X)
        var, ls = self._hyperparameters()  # one read each
        Zs, Xs = _centred(Z / ls, X / ls)
        scale = matrix_scale(var)
        Kzz = scale * self.profile(self._sqdist(Zs, Zs))
        if Zs.dim() == 2 and var.dim() == 0 and Xs.shape[:-2].numel() > 1:
            # One Z, inputs with batch dims (draws, paths): one (M, prod(batch) N) product,
            # returned as a (..., M, N) view of it. The conditional solves against all the
            # batch's columns at once (gp/conditional.py), which in this layout is a view too;
            # computed per batch entry, K_ZX would be copied into it (and back in the
            # backward pass): a quarter of an alpha-objective step with S = 10 draws.
            Kf = self._cross_covariance(Zs, Xs.reshape(-1, Xs.shape[-1]), var)
            Kzx = Kf.unflatten(-1, Xs.shape[:-1]).movedim(0, -2)
        else:
            Kzx = self._cross_covariance(Zs, Xs, var)
        return Kzz, Kzx, pointwise(var, X)

    def _cross_covariance(self, Zs, Xs, var):
        """``K_ZX`` ``(..., M, N)`` from inputs already divided by the lengthscales."""
        return matrix_scale(var) * self.profile(self._sqdist(Zs, Xs))


def _centred(A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``A - c, B - c`` with ``c`` the mean row of ``A`` (not differentiated: distances do not
    depend on it). The expansion ``|a|^2 + |b|^2 - 2 a.b`` loses ``eps |a|^2`` absolutely, which
    for inputs far from the origin (raw data with an offset of 100 lengthscales in float32)
    makes ``K_ZZ`` indefinite and conditional variances negative; near the inputs' own centre
    the loss is ``eps`` times their spread only."""
    c = A.detach().mean(-2, keepdim=True)
    return A - c, B - c
