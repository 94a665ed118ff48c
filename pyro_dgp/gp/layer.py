"""``GPLayer``: a multi-output GP layer that owns the sites ``<name>.u`` and ``<name>.f``.

Site contract (``docs/design.md``; the records are in :mod:`pyro_dgp.gp.sites`):

- ``<name>.u``: inducing outputs, event shape ``(D_out, M)``, outside the data plate. Prior
  ``N(0, K_ZZ)`` per output (``N(0, I)`` when whitened), as a residual: the mean function is
  added to ``f``, so ``u = 0`` gives exactly the mean function.
- ``<name>.f``: function values at the layer's inputs, inside the data plate (dim -1), event
  shape ``(D_out,)``, distribution ``p(f | u, f_prev)`` with per-point marginals, masked.

The model's ``.f`` distribution is lazy: the conditional is computed only if the site is
actually sampled (no guide supplied a value). Under a guide that replays ``.f`` the model does
no conditional work at all.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule, PyroParam

from ..kernels import RBF, Kernel
from ..linalg import cholesky, default_jitter
from ..state import swapped
from ..validation import (
    check_finite,
    check_inputs,
    check_positive_finite,
    check_positive_int,
    unique_name,
)
from . import kl  # noqa: F401  (registers the KL to the whitened prior)
from .conditional import conditional, layer_parts, per_output_conditional
from .distributions import LayerConditional, WhitenedPrior, drop_data_dim, masked_out
from .inducing_points import initial_inducing_points
from .sites import FunctionSite, InducingSite, check_replayed_guide, tag

__all__ = ["GPLayer", "random_hyperparameters", "sample_hyperparameters"]

_NO_SWAP = contextlib.nullcontext()  # reusable: enters and exits as often as needed


def _sample_names(m: torch.nn.Module) -> list[str]:
    """``m``'s own PyroSample attribute names (PyroModule's registry of them)."""
    return list(m.__dict__.get("_pyro_samples") or ())


def random_hyperparameters(module: torch.nn.Module) -> dict[str, list[str]]:
    """``{submodule name: its PyroSample attribute names}`` of ``module`` and its children,
    for the submodules that have any (``""`` names ``module`` itself)."""
    return {name: _sample_names(m) for name, m in module.named_modules() if _sample_names(m)}


def sample_hyperparameters(module: torch.nn.Module) -> None:
    """Draw every ``PyroSample`` attribute of ``module`` and its children now: PyroModule
    samples such a site at its first access in a call; touching them before the data plate
    opens keeps global hyperparameters out of it."""
    for _, m in module.named_modules():  # each module once (modules() wraps this generator)
        if m.__dict__.get("_pyro_samples"):  # most modules have none: no list to build
            for attr in _sample_names(m):
                getattr(m, attr)


def _layer_kernel(kernel, Z: torch.Tensor, input_dim: int) -> Kernel:
    """The layer's kernel (default ARD RBF) in the dtype and device of ``Z`` (numbers given to
    a kernel's constructor take torch's default dtype)."""
    if kernel is None:
        one = Z.new_tensor(1.0)  # Z's dtype and device
        kernel = RBF(input_dim, variance=one, lengthscale=one)
    elif not isinstance(kernel, Kernel):
        raise TypeError(
            f"GPLayer: kernel must be a pyro_dgp.kernels.Kernel, got {type(kernel).__name__}"
        )
    # the layer's dtype and device are its inducing inputs' (numbers given to a kernel's
    # constructor take torch's default dtype)
    kernel = kernel.to(dtype=Z.dtype, device=Z.device)
    if kernel.input_dim != input_dim:
        raise ValueError(
            f"GPLayer: kernel input_dim {kernel.input_dim} != layer input_dim "
            f"{input_dim}"
        )
    return kernel


def kernel_outputs(kernel: Kernel) -> int | None:
    """``P`` where ``kernel`` (or a kernel it combines) has one set of hyperparameters per
    output (``outputs=P``), else ``None``."""
    found = {getattr(k, "outputs", None) for k in kernel.modules()} - {None}
    if len(found) > 1:
        raise ValueError(f"kernels combined with different outputs= {sorted(found)}")
    return found.pop() if found else None


class GPLayer(PyroModule):
    """A layer of ``output_dim`` independent GPs sharing a kernel and inducing inputs.

    :param input_dim: D_in.
    :param output_dim: D_out.
    :param num_inducing: M, with ``inducing_points`` initialised from a standard normal; or
    :param inducing_points: ``(M, D_in)`` initial inducing inputs Z (learned), ``M >= 1``;
        their dtype and device are the layer's (an integer tensor or a list: torch's default
        dtype). ``num_inducing``, if also given, must equal M.
    :param kernel: a :class:`~pyro_dgp.kernels.Kernel` over D_in (default ARD RBF); moved to
        Z's dtype and device. A kernel with ``outputs=D_out`` gives each output GP its own
        hyperparameters (layers with stored ``Z`` only).
    :param mean: ``"zero"``, ``"identity"`` (needs D_in == D_out), a fixed finite
        ``(D_in, D_out)`` matrix W (``m(x) = x W``, e.g. a PCA map; stored in Z's dtype and
        device; learned from there with ``train_mean=True``), or a callable
        ``(..., N, D_in) -> (..., N, D_out)``.
    :param whiten: parameterise ``u = L v`` with ``v ~ N(0, I)`` (default).
    :param jitter: relative diagonal jitter for ``K_ZZ`` (default by dtype).
    :param name: site-name prefix; defaults to the attribute name in the parent module
        (``"gp"`` for a layer without one). A layer built on its own also gets a unique Pyro
        name for its parameters, so two top-level layers never share them in Pyro's param
        store; assigned to a parent module it is renamed after its attribute path.
    :param train_inducing: learn Z (default) or keep it fixed.
    :param function_values: ``u`` holds the function values ``f(Z)`` (prior ``N(m(Z), K_ZZ)``)
        instead of the residual ``f(Z) - m(Z)``; needed where ``u`` is the next layer's
        inducing inputs (inducing points as inducing locations, Ustyuzhaninov et al. 2020, §4.2),
        unwhitened
        only. A layer that receives random inducing inputs (``given_inducing_inputs``) holds
        function values (centred) or is whitened (non-centred: ``u = L_Z^-1 (f(Z) - m(Z))``,
        prior ``N(0, I)`` whatever ``Z``).
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        num_inducing: int | None = None,
        inducing_points: torch.Tensor | None = None,
        kernel: Kernel | None = None,
        mean: str | torch.Tensor | Callable = "zero",
        whiten: bool = True,
        jitter: float | None = None,
        name: str | None = None,
        train_inducing: bool = True,
        function_values: bool = False,
        train_mean: bool = False,
    ):
        own_name = unique_name(name or type(self).__name__)
        super().__init__(name=own_name)
        self._own_pyro_name = own_name  # replaced by the attribute path under a parent
        self.input_dim = check_positive_int(input_dim, "GPLayer: input_dim")
        self.output_dim = check_positive_int(output_dim, "GPLayer: output_dim")
        inducing_points = initial_inducing_points(num_inducing, inducing_points,
                                                   self.input_dim)
        if train_inducing:
            self.inducing_points = PyroParam(inducing_points.clone())
        else:
            self.register_buffer("inducing_points", inducing_points.clone())
        self.kernel = _layer_kernel(kernel, inducing_points, self.input_dim)
        self._mean_kind, self._mean_fn = self._parse_mean(mean, inducing_points, train_mean)
        self.whiten = bool(whiten)
        self.kernel_outputs = kernel_outputs(self.kernel)
        if self.kernel_outputs not in (None, self.output_dim):
            raise ValueError(f"GPLayer: a kernel with outputs={self.kernel_outputs} needs "
                             f"output_dim {self.kernel_outputs}, got {self.output_dim}")
        if jitter is not None:
            jitter = check_positive_finite(jitter, "GPLayer: jitter")
        self.jitter = jitter
        self._site_prefix = name
        if function_values and self.whiten:
            raise ValueError("GPLayer: function_values=True needs whiten=False")
        self.function_values = bool(function_values)
        self._random_Z = None  # inducing inputs of the current call when they are random
        self.inducing_outputs = None  # (..., M, D_out) f(Z) of the last call, function_values
        self.feeds_inducing_inputs = False  # set by models whose next layer uses f(Z) as its Z

    def __getstate__(self):
        # copy / pickle / torch.save: without the last call's f(Z), which holds that call's
        # autograd graph (read only within the call, by the model's next layer)
        state = super().__getstate__()
        state["inducing_outputs"] = None
        return state

    # ----------------------------------------------------------------------------- structure
    def _parse_mean(self, mean, Z: torch.Tensor, train: bool = False):
        if isinstance(mean, str):
            if mean == "zero":
                return "zero", None
            if mean == "identity":
                if self.input_dim != self.output_dim:
                    raise ValueError(
                        f"GPLayer: mean='identity' needs input_dim == output_dim, got "
                        f"{self.input_dim} -> {self.output_dim}; pass a (D_in, D_out) matrix"
                    )
                return "identity", None
            raise ValueError(
                f"GPLayer: mean must be 'zero', 'identity', a matrix or a callable, got {mean!r}"
            )
        if callable(mean) and not isinstance(mean, torch.Tensor):
            return "callable", mean
        W = torch.as_tensor(mean)
        if W.shape != (self.input_dim, self.output_dim):
            raise ValueError(
                f"GPLayer: a linear mean must have shape ({self.input_dim}, {self.output_dim}), "
                f"got {tuple(W.shape)}"
            )
        W = W.to(dtype=Z.dtype, device=Z.device)  # the layer's dtype and device
        check_finite(W, "GPLayer: mean")
        if train:
            self.mean_weight = PyroParam(W.clone())
        else:
            self.register_buffer("mean_weight", W.clone())
        return "linear", None

    def name_if_unnamed(self, name: str) -> None:
        """Take the site prefix ``name`` unless the layer was built with one (``name=``)."""
        if self._site_prefix is None:
            self._site_prefix = name

    @property
    def name(self) -> str:
        """Site-name prefix: ``<name>.u`` and ``<name>.f``."""
        if self._site_prefix:
            return self._site_prefix
        pyro_name = self._pyro_name  # the attribute path, once assigned to a parent module
        return pyro_name if pyro_name and pyro_name != self._own_pyro_name else "gp"

    @property
    def num_inducing(self) -> int:
        return self.inducing_points.shape[-2]

    def mean_function(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., N, D_in) -> (..., N, D_out)``."""
        if self._mean_kind == "zero":
            return x.new_zeros(x.shape[:-1] + (self.output_dim,))
        if self._mean_kind == "identity":
            return x
        if self._mean_kind == "linear":
            return x @ self.mean_weight
        out = self._mean_fn(x)
        if out.dim() < 2 or out.shape[-2:] != (x.shape[-2], self.output_dim):
            raise ValueError(
                f"layer '{self.name}': the mean callable returned shape {tuple(out.shape)} for "
                f"inputs of shape {tuple(x.shape)}, expected (..., {x.shape[-2]}, "
                f"{self.output_dim})"
            )
        return out

    # ------------------------------------------------------------------------------- algebra
    def initial_u_loc(self) -> torch.Tensor:
        """``(D_out, M)`` prior mean of ``u`` at the initial inducing inputs: ``m(Z)`` where ``u``
        holds function values, else 0. Guides start their means here."""
        Z = self.inducing_points.detach()
        if self.function_values:
            with torch.no_grad():
                return self.mean_function(Z).mT.contiguous()
        return Z.new_zeros(self.output_dim, Z.shape[-2])

    def _stored_inducing_points(self) -> torch.Tensor:
        """Z as stored, without a ``pyro.param`` statement: for its shape, dtype, device only."""
        Z = self._parameters.get("inducing_points_unconstrained")
        if Z is None:
            Z = self._buffers.get("inducing_points")
        return Z if Z is not None else self.inducing_points

    @contextlib.contextmanager
    def given_inducing_inputs(self, Z: torch.Tensor | None) -> Iterator[GPLayer]:
        """Within the block, ``prior`` and ``conditional`` use the random inducing inputs ``Z``
        ``(..., M, D_in)`` (e.g. draws of the layer below's ``u``, transposed) instead of the
        stored ones; ``None`` keeps the stored ``Z``."""
        if Z is not None and not (self.function_values or self.whiten):
            raise ValueError(
                f"layer '{self.name}': random inducing inputs need function_values=True "
                "(centred) or whiten=True (non-centred)"
            )
        if Z is not None and self.kernel_outputs:
            raise ValueError(f"layer '{self.name}': random inducing inputs need a kernel "
                             "shared by the outputs, not one with outputs=")
        keep = Z is None and self._random_Z is None  # the stored Z already: nothing to swap
        with contextlib.nullcontext() if keep else swapped(self, "_random_Z", Z):
            yield self

    def current_inducing_inputs(self) -> torch.Tensor:
        """``(M, D_in)``, or ``(..., M, D_in)`` where this call's inducing inputs are random."""
        return self._random_Z if self._random_Z is not None else self.inducing_points

    def kzz_cholesky(self) -> torch.Tensor:
        """``(..., M, M)`` lower Cholesky factor of ``K_ZZ`` (jitter escalated on failure)."""
        return self.cholesky_of(self.kernel(self.current_inducing_inputs()))

    def cholesky_of(self, Kzz: torch.Tensor) -> torch.Tensor:
        """``(..., M, M)`` lower Cholesky factor of this layer's ``Kzz`` (its jitter)."""
        jitter = self.jitter if self.jitter is not None else default_jitter(Kzz.dtype)
        return cholesky(Kzz, jitter=jitter, name=f"layer '{self.name}'")

    def conditional(
        self,
        x: torch.Tensor,
        u_loc: torch.Tensor,
        u_scale_tril: torch.Tensor | None = None,
        Lzz: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginals of ``f(x)`` given ``u`` (``u_scale_tril=None``) or ``u ~ N(u_loc, S)``.

        :param x: ``(..., N, D_in)``.
        :param u_loc: ``(..., D_out, M)`` in this layer's (whitened or not) parameterisation.
        :param u_scale_tril: ``(..., D_out, M, M)`` or ``None``.
        :returns: ``(loc, var)``, each ``(..., N, D_out)``, the mean function included.
        """
        Z, Kzx, Lzz, kxx = layer_parts(self, x, Lzz)
        if self.function_values:
            u_loc = u_loc - self.mean_function(Z).mT
        solve = per_output_conditional if self.kernel_outputs is not None else conditional
        loc, var = solve(Kzx, Lzz, kxx, u_loc, u_scale_tril, self.whiten)
        return loc + self.mean_function(x), var

    def prior_variance(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., N, D_out)`` prior variances ``k_d(x_n, x_n)`` at ``x`` ``(..., N, D_in)``."""
        if self.kernel_outputs:
            return self.kernel(x.unsqueeze(-3), diag=True).mT
        kxx = self.kernel(x, diag=True)
        return kxx.unsqueeze(-1).expand(kxx.shape + (self.output_dim,))

    def prior(self) -> dist.Distribution:
        """``p(u)``: event shape ``(D_out, M)``; batched like random inducing inputs where
        ``u`` holds ``f(Z)``, ``N(0, I)`` whatever ``Z`` where whitened."""
        if self.whiten:
            # also at random inducing inputs (non-centred: u = L_Z^-1 (f(Z) - m(Z)));
            # N(0, I) needs only Z's size, dtype and device: no pyro.param read of Z; it has
            # no parameters, so one instance serves every call (the guides' runs of the model
            # build a prior they then replace)
            Z = self._stored_inducing_points()
            key = (self.output_dim, Z.shape[-2], Z.dtype, Z.device)
            cached = self.__dict__.get("_whitened_prior")
            if cached is None or cached[0] != key:
                prior = WhitenedPrior(self.output_dim, Z.shape[-2], dtype=Z.dtype, device=Z.device)
                self.__dict__["_whitened_prior"] = cached = (key, prior)
            return cached[1]
        Z = self.current_inducing_inputs()
        M = Z.shape[-2]
        tril = self.kzz_cholesky()
        if self.function_values:
            loc = self.mean_function(Z).mT
        else:
            loc = Z.new_zeros(self.output_dim, M)
        if self.kernel_outputs:  # a factor per output, (D, M, M); its Z is stored
            return dist.MultivariateNormal(loc, scale_tril=tril).to_event(1)
        if Z.dim() > 2:  # random Z: put back the data plate's singleton dim
            loc, tril = loc.unsqueeze(-3), tril.unsqueeze(-3)
        loc = loc.expand(torch.broadcast_shapes(loc.shape[:-2], tril.shape[:-2]) + loc.shape[-2:])
        tril = tril.unsqueeze(-3).expand(loc.shape + (M,))
        return dist.MultivariateNormal(loc, scale_tril=tril).to_event(1)

    # ------------------------------------------------------------------------------- model
    def forward(
        self,
        x: torch.Tensor,
        plate: pyro.plate | None = None,
        inducing_inputs: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sample ``<name>.u`` then ``<name>.f`` at ``x``.

        :param x: ``(..., N, D_in)`` layer inputs (the data, or the previous layer's ``f``).
        :param plate: the model's data plate (dim -1); a plate of size N is made if omitted.
        :param inducing_inputs: ``(..., M, D_in)`` random inducing inputs for this call (the
            previous layer's ``inducing_outputs``); needs ``function_values=True`` (centred)
            or ``whiten=True`` (non-centred).
        :returns: ``f`` of shape ``(..., N, D_out)``.
        """
        if is_validation_enabled():  # a pass over x and a host sync: not in fit's hot loop
            check_inputs(x, self.input_dim, f"layer '{self.name}' input")
        Z = self._stored_inducing_points()
        if x.dtype != Z.dtype or x.device != Z.device:
            raise ValueError(
                f"layer '{self.name}' holds {Z.dtype} parameters on {Z.device} but its input is "
                f"{x.dtype} on {x.device}: build the model from the same data, or move it with "
                f"model.to(dtype=..., device=...)"
            )
        name = self.name
        check_replayed_guide(self, name)
        sample_hyperparameters(self)
        # the stored Z (the common case): no generator-based context to build per call
        swap = inducing_inputs is not None or self._random_Z is not None
        with self.given_inducing_inputs(inducing_inputs) if swap else _NO_SWAP:
            u = pyro.sample(f"{name}.u", self.prior(), infer=tag(InducingSite(self)))
            u = drop_data_dim(u)
            if self.function_values:
                self.inducing_outputs = u.mT
            if plate is None:
                plate = pyro.plate(f"{name}.data", x.shape[-2], dim=-1)
            with plate:
                fn = masked_out(LayerConditional(self, x, u))
                # where u is also the next layer's inducing inputs, guides must draw f given the
                # sampled u (a collapsed f would lose its dependence on that input)
                record = FunctionSite(self, x, u, given_u_only=self.feeds_inducing_inputs)
                return pyro.sample(f"{name}.f", fn, infer=tag(record))
