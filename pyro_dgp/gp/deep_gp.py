"""``DeepGP``: a stack of :class:`~pyro_dgp.layer.GPLayer` with a likelihood (DSVI, seed 002)."""

from __future__ import annotations

import contextlib
import itertools
import warnings

import numpy as np
import pyro
import torch
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule
from scipy.cluster.vq import kmeans2

from .. import kernels as K
from ..likelihoods.base import BernoulliProbit, Gaussian, Likelihood, StudentT
from ..validation import (
    check_inputs,
    check_positive_finite,
    check_positive_int,
    check_targets,
    unique_name,
)
from .layer import GPLayer, sample_hyperparameters

__all__ = ["DeepGP"]


_KERNELS = {
    "rbf": K.RBF,
    "matern12": K.Matern12,
    "matern32": K.Matern32,
    "matern52": K.Matern52,
}


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype):
    """Build modules directly in the data's dtype (a float32 build cast to float64 would keep
    float32 rounding in its initial values)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _kmeans(X: torch.Tensor, M: int, seed: int) -> torch.Tensor:
    """``(M, D)`` k-means centres of ``X`` (scipy's k-means++), on X's device and dtype."""
    if M == X.shape[0]:
        return X.clone()
    Xn = X.detach().cpu().double().numpy()
    centres, _ = kmeans2(Xn, M, minit="++", seed=np.random.default_rng(seed))
    return torch.as_tensor(centres, dtype=X.dtype, device=X.device)


def _linear_mean(X: torch.Tensor, d_out: int) -> torch.Tensor:
    """DSVI's fixed inner-layer mean ``x W``, ``W`` of shape ``(D_in, d_out)`` for ``X`` of
    shape ``(N, D_in)``: identity, PCA projection, or identity padded.

    The PCA projection has at most ``N`` directions: with fewer points than hidden dims
    (``N < d_out < D_in``) its last ``d_out - N`` columns are zeros (those hidden dims start
    with a zero mean and are left to their GPs)."""
    d_in = X.shape[-1]
    if d_in == d_out:
        return torch.eye(d_in, dtype=X.dtype, device=X.device)
    if d_in > d_out:
        # top principal directions of the (centred) layer inputs
        _, _, Vh = torch.linalg.svd(X - X.mean(0), full_matrices=False)
        W = Vh[:d_out].mT
        if W.shape[1] < d_out:  # fewer points than hidden dims: zero columns
            W = torch.cat([W, W.new_zeros(d_in, d_out - W.shape[1])], dim=1)
        return W.contiguous()
    return torch.cat([torch.eye(d_in, dtype=X.dtype, device=X.device),
                      X.new_zeros(d_in, d_out - d_in)], dim=1)


def _warn_unstandardised(X: torch.Tensor, y: torch.Tensor | None) -> None:
    """Warn where ``regression``'s defaults, which assume standardised data, do not fit it.

    The initial noise variance (0.01), kernel variances and lengthscales (2) and the last
    layer's zero mean are on the scale of standardised targets and inputs: on raw targets in
    the thousands the noise must grow by orders of magnitude before the predictive variance
    means anything (a review found badly miscalibrated intervals after thousands of steps,
    silently), and inputs far from the origin cost float32 digits in every kernel matrix."""
    with torch.no_grad():
        msgs = []
        if y is not None and y.numel() > 1:
            m, s = float(y.mean()), float(y.std())
            if not (0.1 <= s <= 10 and abs(m) <= 3 * s):
                msgs.append(f"y has mean {m:.3g} and standard deviation {s:.3g}")
        if X.shape[0] > 1:
            m, s = X.mean(0).abs().max(), X.std(0).max()
            if float(m) > 100 or float(s) > 100:
                msgs.append(f"X has columns with |mean| up to {float(m):.3g} and standard "
                            f"deviation up to {float(s):.3g}")
    if msgs:
        warnings.warn(
            "DeepGP.regression's initial noise variance, kernel variances and lengthscales "
            f"assume standardised data, but {' and '.join(msgs)}: standardise them "
            "(pyro_dgp.datasets.load and pyro_dgp.datasets.load_csv do; keep the statistics "
            "to report in original units), or pass noise_variance, kernel_variance and "
            "lengthscale on the data's scale",
            UserWarning, stacklevel=3)


class DeepGP(PyroModule):
    """``y ~ likelihood(f^L)``, ``f^l = GP_l(f^{l-1})``, ``f^0 = X``.

    ``forward(X, y=None)`` is the Pyro model: ``X`` is ``(B, D)`` (a minibatch or all the data),
    ``y`` is ``(B,)``. ``num_data`` (N) scales a minibatch's likelihood by ``N / B``.

    :param layers: the GP layers, first to last; each layer's output_dim is the next one's
        input_dim, the last has output_dim 1.
    :param likelihood: a :class:`~pyro_dgp.likelihoods.Likelihood`; moved to the first layer's
        dtype and device.
    :param num_data: N, the size of the full training set (``None``: each call's B).
    :param inducing: ``"fixed"`` (DSVI: every layer has its own inducing inputs) or
        ``"locations"`` (seed 003 §4.2: only the first layer's inducing inputs ``z`` exist;
        layer l's inducing inputs are layer l-1's values ``f^z_{l-1}``, so its prior is
        ``p(f^z_l | f^z_{l-1}) = N(m_l(f^z_{l-1}), k_l(f^z_{l-1}, f^z_{l-1}))``). Every
        layer but the last holds function values (``function_values=True``, unwhitened). The
        last layer holds function values too (centred, as in seed 003), or is whitened at its
        random inducing inputs (non-centred): its site holds ``v`` with
        ``f^z_L = m_L(f^z_{L-1}) + chol(k_L(f^z_{L-1}, f^z_{L-1})) v`` and prior ``N(0, I)``.
        Both are the same deep GP (the same ``p(y)``); a mean-field guide over the sites gives
        different families: ``q(f^z_{L-1}) q(f^z_L)`` centred, ``q(f^z_{L-1}) q(v)``
        non-centred, where ``q(f^z_L | f^z_{L-1})`` follows the draw of the inducing inputs and
        the KL of the last layer is ``KL(q(v) || N(0, I))``, free of ``k_L(f^z_{L-1})^{-1}``.
    """

    def __init__(self, layers, likelihood: Likelihood, num_data: int | None = None, name=None,
                 inducing: str = "fixed"):
        super().__init__(name=name if name is not None else unique_name("DeepGP"))
        if isinstance(layers, GPLayer):
            raise TypeError("DeepGP: layers must be a list of GPLayer, got a single GPLayer; "
                            "use DeepGP([layer], ...)")
        layers = list(layers)
        if not layers:
            raise ValueError("DeepGP needs at least one layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, GPLayer):
                raise TypeError("DeepGP: layers must be GPLayer instances, got "
                                f"{type(layer).__name__} at position {i}")
        if not isinstance(likelihood, Likelihood):
            raise TypeError("DeepGP: likelihood must be a pyro_dgp.likelihoods.Likelihood, got "
                            f"{type(likelihood).__name__}")
        if num_data is not None:
            num_data = check_positive_int(num_data, "DeepGP: num_data")
        for a, b in zip(layers[:-1], layers[1:], strict=False):
            if a.output_dim != b.input_dim:
                raise ValueError(
                    f"layer '{a.name}' outputs {a.output_dim} dims but the next layer expects "
                    f"{b.input_dim}"
                )
        for i, layer in enumerate(layers):
            if layer._site_prefix is None:
                layer._site_prefix = f"layer{i + 1}"
        names = [layer.name for layer in layers]
        if len(set(names)) != len(names):
            raise ValueError(f"layer names must be unique, got {names}")
        if inducing not in ("fixed", "locations"):
            raise ValueError(f"inducing must be 'fixed' or 'locations', got {inducing!r}")
        if inducing == "locations":
            # a layer whose u is the next layer's inducing inputs must hold f(Z); the last
            # layer only receives random inducing inputs: centred (f(Z)) or whitened
            bad = [layer.name for layer in layers[:-1] if not layer.function_values]
            last = layers[-1]
            if not (last.function_values or last.whiten):
                bad.append(last.name)
            if bad:
                raise ValueError(
                    "inducing='locations' needs function_values=True on every layer but the "
                    f"last, and function_values=True or whiten=True on the last: {bad}"
                )
            for a, b in zip(layers[:-1], layers[1:], strict=False):
                if a.num_inducing != b.num_inducing:
                    raise ValueError("inducing='locations' needs the same M in every layer")
                a.feeds_inducing_inputs = True
        self.inducing = inducing
        self.layers = PyroModule[torch.nn.ModuleList](layers)
        Z = layers[0].inducing_points  # the model's dtype and device
        self.likelihood = likelihood.to(dtype=Z.dtype, device=Z.device)
        self.num_data = num_data

    @property
    def input_dim(self) -> int:
        return self.layers[0].input_dim

    def example_args(self) -> tuple[torch.Tensor]:
        """Arguments of a prototype run before any data: one input row of zeros in the
        model's dtype and device (guides build their parameters from it)."""
        Z = self.layers[0].inducing_points.detach()
        return (Z.new_zeros(1, self.input_dim),)

    def forward(self, X: torch.Tensor, y: torch.Tensor | None = None):
        # finiteness with Pyro's validation only: fit checks the data once, then runs its
        # steps without validation
        check_inputs(X, self.input_dim, finite=is_validation_enabled())
        B = X.shape[-2]
        N = self.num_data if self.num_data is not None and self.num_data >= B else B
        plate = pyro.plate("data", N, subsample=torch.arange(B, device=X.device), dim=-1)
        h, Z = X, None
        for layer in self.layers:
            h = layer(h, plate=plate, inducing_inputs=Z)
            if self.inducing == "locations":
                # seed 003 §4.2: this layer's values at its inducing inputs are the next
                # layer's inducing inputs
                Z = layer.inducing_outputs
        sample_hyperparameters(self.likelihood)
        with plate:
            return self.likelihood(h, y)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def regression(
        cls,
        X: torch.Tensor,
        y: torch.Tensor,
        num_layers: int = 2,
        hidden_dim: int | None = None,
        num_inducing: int = 100,
        kernel: str = "rbf",
        likelihood: str | Likelihood = "gaussian",
        whiten: bool = True,
        noise_variance: float = 0.01,
        inner_noise: float = 1e-5,
        kernel_variance: float = 2.0,
        lengthscale: float = 2.0,
        jitter: float | None = None,
        seed: int = 0,
        name: str | None = None,
        inducing: str = "fixed",
    ) -> DeepGP:
        """A DSVI deep GP initialised as in REFERENCE.md §1.

        k-means inducing inputs, propagated through the fixed linear (identity/PCA) means of
        the inner layers; ARD kernels with variance and lengthscales ``2``; between-layer noise
        ``inner_noise`` (a White kernel) on inner layers; zero mean on the last layer.
        Everything is created on ``X``'s device and dtype.

        :param X: ``(N, D)`` training inputs; :param y: ``(N,)`` training targets.
        :param hidden_dim: width of inner layers, default ``min(30, D)``.
        :param likelihood: ``"gaussian"``, ``"studentt"``, ``"probit"`` or an instance.
        :param inducing: ``"fixed"`` or ``"locations"`` (see :class:`DeepGP`).
        :param whiten: whitened inducing outputs (default). With ``inducing="locations"`` the
            layers whose ``u`` is the next layer's inducing inputs always hold ``f(Z)``; the
            last layer is whitened at its random inducing inputs (non-centred) if ``whiten``,
            else it holds ``f(Z)`` too (seed 003 §4.2 as published). See :class:`DeepGP`.
        """
        check_inputs(X)
        if X.dim() != 2:
            raise ValueError(f"X must be 2-D (N, D), got shape {tuple(X.shape)}")
        N, D = X.shape
        binary = likelihood == "probit" or isinstance(likelihood, BernoulliProbit)
        check_targets(y, N, binary=binary)
        if y.dim() != 1:
            raise ValueError(f"y must be 1-D of shape (N,), got shape {tuple(y.shape)}")
        num_layers = check_positive_int(num_layers, "num_layers")
        M = check_positive_int(num_inducing, "num_inducing", upper=N)
        hidden = check_positive_int(hidden_dim if hidden_dim is not None else min(30, D),
                                    "hidden_dim")
        if kernel not in _KERNELS:
            raise ValueError(f"kernel must be one of {sorted(_KERNELS)}, got {kernel!r}")
        if seed is not None:
            seed = check_positive_int(seed, "DeepGP.regression: seed", allow_zero=True)
        if isinstance(likelihood, str) and likelihood in ("gaussian", "studentt"):
            noise_variance = check_positive_finite(noise_variance,
                                                   "DeepGP.regression: noise_variance")
        _warn_unstandardised(X, None if binary else y)
        makers = {
            "gaussian": lambda: Gaussian(noise_variance),
            "studentt": lambda: StudentT(scale=noise_variance**0.5),
            "probit": BernoulliProbit,
        }
        if isinstance(likelihood, str) and likelihood not in makers:
            raise ValueError(f"likelihood must be one of {sorted(makers)}, got {likelihood!r}")
        if not isinstance(likelihood, (str, Likelihood)):
            raise TypeError(
                f"DeepGP.regression: likelihood must be one of {sorted(makers)} or a "
                f"pyro_dgp.likelihoods.Likelihood, got {type(likelihood).__name__}"
            )
        with _default_dtype(X.dtype):
            if isinstance(likelihood, str):
                likelihood = makers[likelihood]()
            model = cls._build_stack(X, likelihood, num_layers, hidden, M, kernel, whiten,
                                     inner_noise, kernel_variance, lengthscale, jitter, seed,
                                     name, inducing)
        return model.to(device=X.device, dtype=X.dtype)

    @classmethod
    def _build_stack(cls, X, likelihood, num_layers, hidden, M, kernel, whiten, inner_noise,
                     kernel_variance, lengthscale, jitter, seed, name, inducing) -> DeepGP:
        locations = inducing == "locations"
        N, D = X.shape
        dims = [D] + [hidden] * (num_layers - 1) + [1]
        Z = _kmeans(X, M, seed)
        H = X.detach()
        layers = []
        for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
            last = i == num_layers - 1
            base = _KERNELS[kernel](d_in, variance=kernel_variance, lengthscale=lengthscale)
            kern = base if last else K.Sum(base, K.White(d_in, variance=inner_noise))
            mean = "zero" if last else _linear_mean(H, d_out)
            # with locations, a layer whose u feeds the next layer's inducing inputs holds
            # f(Z) (unwhitened); the last layer is whitened (non-centred) if `whiten`
            values = locations and not (last and whiten)
            layers.append(
                GPLayer(d_in, d_out, inducing_points=Z, kernel=kern, mean=mean,
                        whiten=whiten and not values, jitter=jitter, name=f"layer{i + 1}",
                        function_values=values,
                        # with locations, inner Z are random (the previous layer's f^z): the
                        # stored Z only sets the guides' initial means
                        train_inducing=not (locations and i > 0))
            )
            if not last:
                Z, H = Z @ mean, H @ mean
        return cls(layers, likelihood, num_data=N, name=name, inducing=inducing)

    @classmethod
    def classification(cls, X: torch.Tensor, y: torch.Tensor, **kwargs) -> DeepGP:
        """A deep GP with a Bernoulli-probit likelihood; ``y`` holds labels 0/1.

        Takes the keyword arguments of :meth:`regression` except ``likelihood``.
        """
        if "likelihood" in kwargs:
            raise TypeError("classification() sets the likelihood itself (Bernoulli-probit)")
        return cls.regression(X, y, likelihood="probit", **kwargs)
