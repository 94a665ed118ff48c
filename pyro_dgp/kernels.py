"""Batched covariance functions.

``pyro.contrib.gp`` kernels accept only 2-D inputs; deep GP layers evaluate kernels on inputs
with leading sample dimensions (particles, predictive samples), so these kernels broadcast over
any leading batch dims.

Every kernel is called as ``kernel(X1, X2=None, diag=False)``:

- ``X1``: ``(..., N, D)``, ``X2``: ``(..., M, D)`` -> ``(..., N, M)``
- ``X2=None`` means ``X2 = X1`` *and* the same points, so noise-like kernels (``White``) add
  their diagonal only there;
- ``diag=True`` -> ``(..., N)``, the variances ``k(x_i, x_i)``.

Hyperparameters are positive ``PyroParam``s; assign a ``PyroSample`` to make one Bayesian.
Their initial values are numbers (torch's default dtype) or floating-point tensors, which keep
their own dtype and device. A kernel built on its own gets a unique Pyro name, so two
top-level kernels never share parameters in Pyro's param store; assigned to a layer it is
renamed after its attribute path (``<layer>.kernel``).
"""

from __future__ import annotations

import math

import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam

from .validation import check_positive_int, positive_tensor, unique_name

__all__ = [
    "Kernel",
    "Stationary",
    "RBF",
    "Matern12",
    "Matern32",
    "Matern52",
    "Periodic",
    "White",
    "Sum",
    "Product",
]


def _positive(kernel: Kernel, name: str, value, ard: bool | None = None) -> torch.Tensor:
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


def _matrix_scale(v: torch.Tensor) -> torch.Tensor:
    """A scalar hyperparameter drawn per sample (a ``PyroSample`` under outer plates) has batch
    shape ``(..., 1)``, its last dim the data plate's singleton; as a factor of ``(..., N, M)``
    matrices it must be ``(..., 1, 1)``."""
    return v.unsqueeze(-1) if v.dim() else v


def _pointwise(v: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """A scalar hyperparameter broadcast to ``X``'s points, ``(..., N)``."""
    if v.dim() == 0:  # the common case, without torch.broadcast_shapes' Python overhead
        return v.expand(X.shape[:-1]).to(X.dtype)
    return v.expand(torch.broadcast_shapes(v.shape, X.shape[:-1])).to(X.dtype)


def _per_dim(v: torch.Tensor) -> torch.Tensor:
    """An ARD hyperparameter ``(D,)`` or ``(..., 1, D)`` per sample, shaped to divide
    ``(..., N, M, D)`` pairwise differences."""
    return v.unsqueeze(-2) if v.dim() > 1 else v


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
        return Sum(self, other)

    def __mul__(self, other: Kernel) -> Product:
        return Product(self, other)


class Stationary(Kernel):
    """A kernel ``variance * g(r)`` of the scaled distance ``r = |x - x'| / lengthscale``.

    ``lengthscale`` is a scalar (isotropic) or ``(D,)`` (ARD, ``ard=True``).
    """

    def __init__(self, input_dim: int, variance=1.0, lengthscale=1.0, ard: bool = True):
        super().__init__(input_dim)
        self.variance = PyroParam(_positive(self, "variance", variance), constraints.positive)
        self.lengthscale = PyroParam(_positive(self, "lengthscale", lengthscale, bool(ard)),
                                     constraints.positive)

    #: compute distances directly instead of by |a|^2 + |b|^2 - 2 a.b (see _scaled_sqdist)
    exact_distance = False

    def _scaled_sqdist(self, X1: torch.Tensor, X2: torch.Tensor) -> torch.Tensor:
        ls = self.lengthscale
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
        var = self.variance
        if diag:
            return _pointwise(var, X1)
        if X2 is None:
            X2 = X1
        else:
            self._check(X2)
        return _matrix_scale(var) * self.profile(self._scaled_sqdist(X1, X2))

    def conditional_parts(self, Z, X):
        if type(self).forward is not Stationary.forward:  # a subclass with its own forward
            return super().conditional_parts(Z, X)
        self._check(Z)
        self._check(X)
        var, ls = self.variance, self.lengthscale  # one read each
        Zs, Xs = _centred(Z / ls, X / ls)
        scale = _matrix_scale(var)
        Kzz = scale * self.profile(self._sqdist(Zs, Zs))
        Kzx = self._cross_covariance(Zs, Xs, var)
        return Kzz, Kzx, _pointwise(var, X)

    def _cross_covariance(self, Zs, Xs, var):
        """``K_ZX`` ``(..., M, N)`` from inputs already divided by the lengthscales."""
        return _matrix_scale(var) * self.profile(self._sqdist(Zs, Xs))


def _centred(A: torch.Tensor, B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``A - c, B - c`` with ``c`` the mean row of ``A`` (not differentiated: distances do not
    depend on it). The expansion ``|a|^2 + |b|^2 - 2 a.b`` loses ``eps |a|^2`` absolutely, which
    for inputs far from the origin (raw data with an offset of 100 lengthscales in float32)
    makes ``K_ZZ`` indefinite and conditional variances negative; near the inputs' own centre
    the loss is ``eps`` times their spread only."""
    c = A.detach().mean(-2, keepdim=True)
    return A - c, B - c


class RBF(Stationary):
    """Squared exponential: ``variance * exp(-r^2 / 2)``."""

    def profile(self, r2):
        return torch.exp(-0.5 * r2)

    def _cross_covariance(self, Zs, Xs, var):
        if var.dim() or self.exact_distance:
            return super()._cross_covariance(Zs, Xs, var)
        # var exp(-|z - x|^2 / 2) = exp(z~ . x~) with z~ = [z, log var - |z|^2 / 2, 1] and
        # x~ = [x, 1, -|x|^2 / 2]: one thin GEMM and one exp over the (M, N) matrix, and in
        # the backward pass one product and two thin GEMMs, instead of about ten elementwise
        # passes (scale, exp, clamp, adds) each way. Same rounding as |z|^2 + |x|^2 - 2 z.x,
        # which enters exp(-r^2 / 2) at second order only.
        ones_z = Zs.new_ones(Zs.shape[:-1] + (1,))
        ones_x = Xs.new_ones(Xs.shape[:-1] + (1,))
        z_aug = torch.cat([Zs, var.log() - 0.5 * Zs.square().sum(-1, keepdim=True), ones_z], -1)
        x_aug = torch.cat([Xs, ones_x, -0.5 * Xs.square().sum(-1, keepdim=True)], -1)
        # in place: the product is not needed by the GEMM's backward, and exp's backward reads
        # its result; one fewer (M, N) allocation
        return (z_aug @ x_aug.mT).exp_()


def _dist(r2: torch.Tensor) -> torch.Tensor:
    # sqrt has an infinite derivative at 0; the tiny floor keeps gradients finite on the diagonal.
    return torch.sqrt(r2 + torch.finfo(r2.dtype).tiny ** 0.5)


class Matern12(Stationary):
    """Exponential kernel: ``variance * exp(-r)``."""

    exact_distance = True

    def profile(self, r2):
        return torch.exp(-_dist(r2))


class Matern32(Stationary):
    """``variance * (1 + sqrt(3) r) exp(-sqrt(3) r)``."""

    def profile(self, r2):
        s = math.sqrt(3.0) * _dist(r2)
        return (1 + s) * torch.exp(-s)


class Matern52(Stationary):
    """``variance * (1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)``."""

    def profile(self, r2):
        s = math.sqrt(5.0) * _dist(r2)
        return (1 + s + s * s / 3) * torch.exp(-s)


class Periodic(Kernel):
    """``variance * exp(-2 sum_d sin^2(pi (x_d - x'_d) / period) / lengthscale_d^2)``."""

    def __init__(self, input_dim: int, variance=1.0, lengthscale=1.0, period=1.0, ard=True):
        super().__init__(input_dim)
        ard = bool(ard)
        self.variance = PyroParam(_positive(self, "variance", variance), constraints.positive)
        self.lengthscale = PyroParam(_positive(self, "lengthscale", lengthscale, ard),
                                     constraints.positive)
        self.period = PyroParam(_positive(self, "period", period, ard), constraints.positive)

    def forward(self, X1, X2=None, diag=False):
        self._check(X1)
        if diag:
            return _pointwise(self.variance, X1)
        if X2 is None:
            X2 = X1
        else:
            self._check(X2)
        diff = X1.unsqueeze(-2) - X2.unsqueeze(-3)  # (..., N, M, D)
        s = torch.sin(math.pi * diff / _per_dim(self.period)) / _per_dim(self.lengthscale)
        return _matrix_scale(self.variance) * torch.exp(-2 * (s * s).sum(-1))


class White(Kernel):
    """White noise ``variance * [x == x']``, counted only when ``X2`` is omitted.

    Added to an inner layer's kernel it is the between-layer noise of DSVI: it enters ``K_ZZ``
    and ``k(x, x)`` but not the cross-covariance ``K_ZX``.
    """

    def __init__(self, input_dim: int, variance=1e-5):
        super().__init__(input_dim)
        self.variance = PyroParam(_positive(self, "variance", variance), constraints.positive)

    def forward(self, X1, X2=None, diag=False):
        self._check(X1)
        if diag:
            return _pointwise(self.variance, X1)
        if X2 is not None:
            self._check(X2)
            shape = torch.broadcast_shapes(X1.shape[:-2], X2.shape[:-2])
            return X1.new_zeros(shape + (X1.shape[-2], X2.shape[-2]))
        eye = torch.eye(X1.shape[-2], dtype=X1.dtype, device=X1.device)
        return _matrix_scale(self.variance) * eye.expand(X1.shape[:-2] + eye.shape)

    def conditional_parts(self, Z, X):
        self._check(Z)
        self._check(X)
        var = self.variance
        eye = torch.eye(Z.shape[-2], dtype=Z.dtype, device=Z.device)
        Kzz = _matrix_scale(var) * eye.expand(Z.shape[:-2] + eye.shape)
        return Kzz, None, _pointwise(var, X)


class _Combination(Kernel):
    def __init__(self, *kernels: Kernel):
        if len(kernels) < 2:
            raise ValueError("a kernel combination needs at least two kernels")
        bad = [type(k).__name__ for k in kernels if not isinstance(k, Kernel)]
        if bad:
            raise TypeError(f"{type(self).__name__}: kernels must be pyro_dgp kernels, got {bad}")
        dims = {k.input_dim for k in kernels}
        if len(dims) != 1:
            raise ValueError(f"combined kernels must share input_dim, got {sorted(dims)}")
        super().__init__(dims.pop())
        self.kernels = PyroModule[torch.nn.ModuleList](kernels)


class Sum(_Combination):
    """``k1 + k2 + ...``"""

    def forward(self, X1, X2=None, diag=False):
        kernels = self.kernels
        if X2 is not None and not diag:
            # White is zero between distinct point sets: skip its (N, M) zeros and their add
            # (the cross-covariance K_ZX of an inner DSVI layer is the hot path)
            kernels = [k for k in kernels if not isinstance(k, White)] or kernels[:1]
        out = kernels[0](X1, X2, diag)
        for k in kernels[1:]:
            out = out + k(X1, X2, diag)
        return out

    def conditional_parts(self, Z, X):
        Kzz, Kzx, kxx = self.kernels[0].conditional_parts(Z, X)
        for k in self.kernels[1:]:
            kzz, kzx, kd = k.conditional_parts(Z, X)
            Kzz, kxx = Kzz + kzz, kxx + kd
            if kzx is not None:
                Kzx = kzx if Kzx is None else Kzx + kzx
        return Kzz, Kzx, kxx


class Product(_Combination):
    """``k1 * k2 * ...`` (elementwise)."""

    def forward(self, X1, X2=None, diag=False):
        out = self.kernels[0](X1, X2, diag)
        for k in self.kernels[1:]:
            out = out * k(X1, X2, diag)
        return out
