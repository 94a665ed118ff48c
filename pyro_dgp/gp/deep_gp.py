"""``DeepGP``: a stack of :class:`~pyro_dgp.layer.GPLayer` with a likelihood (DSVI: Salimbeni and
Deisenroth 2017)."""

from __future__ import annotations

import pyro
import torch
from pyro.infer.util import is_validation_enabled
from pyro.nn import PyroModule

from ..deprecation import renamed_keywords, renamed_value, warn_renamed
from ..likelihoods import Likelihood
from ..validation import as_tensor_input, check_inputs, check_positive_int, unique_name
from .architectures import (
    LN2,
    check_regression_arguments,
    default_dtype,
    dsvi_layers,
    make_likelihood,
)
from .layer import GPLayer, sample_hyperparameters

__all__ = ["INDUCING_SCHEMES", "DeepGP"]

#: where each layer's inducing inputs come from (:class:`DeepGP`'s ``inducing_scheme``)
INDUCING_SCHEMES = ("per-layer", "propagated")

#: the old spellings of ``inducing_scheme``, the keyword ``inducing``
_OLD_SCHEMES = {"fixed": "per-layer", "locations": "propagated"}


def _scheme(inducing_scheme, where: str) -> str:
    """``inducing_scheme`` checked, an old value (``"fixed"``, ``"locations"``) warned and
    spelled anew."""
    inducing_scheme = renamed_value(inducing_scheme, _OLD_SCHEMES, "inducing_scheme", where)
    if inducing_scheme not in INDUCING_SCHEMES:
        raise ValueError(f"inducing_scheme must be 'per-layer' or 'propagated', got "
                         f"{inducing_scheme!r}")
    return inducing_scheme


class DeepGP(PyroModule):
    """``y ~ likelihood(f^L)``, ``f^l = GP_l(f^{l-1})``, ``f^0 = X``.

    ``forward(X, y=None)`` is the Pyro model: ``X`` is ``(B, D)`` (a minibatch or all the data),
    ``y`` is ``(B,)``. ``num_data`` (N) scales a minibatch's likelihood by ``N / B``.

    :param layers: the GP layers, first to last; each layer's output_dim is the next one's
        input_dim, the last has output_dim 1.
    :param likelihood: a :class:`~pyro_dgp.likelihoods.Likelihood`; moved to the first layer's
        dtype and device.
    :param num_data: N, the size of the full training set (``None``: each call's B).
    :param inducing_scheme: where each layer's inducing inputs come from: ``"per-layer"``
        (DSVI: every layer has its own inducing inputs, parameters) or ``"propagated"``
        (inducing points as inducing locations, Ustyuzhaninov et al. 2020, §4.2: only the first
        layer's inducing inputs ``z`` exist;
        layer l's inducing inputs are layer l-1's values ``f^z_{l-1}``, so its prior is
        ``p(f^z_l | f^z_{l-1}) = N(m_l(f^z_{l-1}), k_l(f^z_{l-1}, f^z_{l-1}))``). Every
        layer but the last holds function values (``function_values=True``, unwhitened). The
        last layer holds function values too (centred, as in Ustyuzhaninov et al. 2020), or is
        whitened at its
        random inducing inputs (non-centred): its site holds ``v`` with
        ``f^z_L = m_L(f^z_{L-1}) + chol(k_L(f^z_{L-1}, f^z_{L-1})) v`` and prior ``N(0, I)``.
        Both are the same deep GP (the same ``p(y)``); a mean-field guide over the sites gives
        different families: ``q(f^z_{L-1}) q(f^z_L)`` centred, ``q(f^z_{L-1}) q(v)``
        non-centred, where ``q(f^z_L | f^z_{L-1})`` follows the draw of the inducing inputs and
        the KL of the last layer is ``KL(q(v) || N(0, I))``, free of ``k_L(f^z_{L-1})^{-1}``.
        (Formerly ``inducing_scheme="per-layer"`` and ``inducing_scheme="propagated"``.)
    """

    @renamed_keywords("DeepGP", inducing="inducing_scheme")
    def __init__(self, layers, likelihood: Likelihood, num_data: int | None = None, name=None,
                 inducing_scheme: str = "per-layer"):
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
            layer.name_if_unnamed(f"layer{i + 1}")
        names = [layer.name for layer in layers]
        if len(set(names)) != len(names):
            raise ValueError(f"layer names must be unique, got {names}")
        inducing_scheme = _scheme(inducing_scheme, "DeepGP")
        if inducing_scheme == "propagated":
            # a layer whose u is the next layer's inducing inputs must hold f(Z); the last
            # layer only receives random inducing inputs: centred (f(Z)) or whitened
            bad = [layer.name for layer in layers[:-1] if not layer.function_values]
            last = layers[-1]
            if not (last.function_values or last.whiten):
                bad.append(last.name)
            if bad:
                raise ValueError(
                    "inducing_scheme='propagated' needs function_values=True on every layer but "
                    "the "
                    f"last, and function_values=True or whiten=True on the last: {bad}"
                )
            for a, b in zip(layers[:-1], layers[1:], strict=False):
                if a.num_inducing != b.num_inducing:
                    raise ValueError("inducing_scheme='propagated' needs the same M in every "
                                     "layer")
                a.feeds_inducing_inputs = True
        self.inducing_scheme = inducing_scheme
        self.layers = PyroModule[torch.nn.ModuleList](layers)
        Z = layers[0].inducing_points  # the model's dtype and device
        self.likelihood = likelihood.to(dtype=Z.dtype, device=Z.device)
        self.num_data = num_data

    @property
    def inducing(self) -> str:
        """Deprecated: the old spelling of :attr:`inducing_scheme` (``"fixed"``,
        ``"locations"``)."""
        warn_renamed("DeepGP.inducing", "DeepGP.inducing_scheme")
        return {new: old for old, new in _OLD_SCHEMES.items()}[self.inducing_scheme]

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
        # each submodule read once: a read is a PyroModule.__getattr__ call
        layers, likelihood = list(self.layers), self.likelihood
        check_inputs(X, layers[0].input_dim, finite=is_validation_enabled())
        B = X.shape[-2]
        N = self.num_data if self.num_data is not None and self.num_data >= B else B
        plate = pyro.plate("data", N, subsample=torch.arange(B, device=X.device), dim=-1)
        h, Z = X, None
        propagated = self.inducing_scheme == "propagated"
        for layer in layers:
            h = layer(h, plate=plate, inducing_inputs=Z)
            if propagated:
                # Ustyuzhaninov et al. 2020, §4.2: this layer's values at its inducing inputs
                # are the next layer's inducing inputs
                Z = layer.inducing_outputs
        sample_hyperparameters(likelihood)
        with plate:
            return likelihood(h, y)

    # ------------------------------------------------------------------ constructors
    @classmethod
    @renamed_keywords("DeepGP.regression", inducing="inducing_scheme")
    def regression(
        cls, X: torch.Tensor, y: torch.Tensor, *,
        num_layers: int = 2, hidden_dim: int | None = None, num_inducing: int | None = None,
        kernel: str = "rbf", likelihood: str | Likelihood = "gaussian", whiten: bool = True,
        noise_variance: float = LN2, inner_noise: float = 1e-5, kernel_variance: float = LN2,
        lengthscale: float = LN2, jitter: float | None = None, seed: int = 0,
        name: str | None = None, inducing_scheme: str = "per-layer", ard: bool = True,
        train_mean: bool = True, kernel_per_output: bool = False,
    ) -> DeepGP:
        """A DSVI deep GP (Salimbeni and Deisenroth 2017) with the package's starting values.

        ``num_inducing`` distinct k-means inducing inputs (default ``min(100, N)``), propagated
        through the linear (identity/PCA) means of the inner layers; ARD kernels; between-layer
        noise ``inner_noise`` (a White kernel) on inner layers; zero mean on the last layer.
        Everything is created on ``X``'s device and dtype (float32 or float64).

        Starting values: noise variance, kernel variances and lengthscales all
        ``ln 2 = softplus(0)`` and learned inner means, chosen over the published start by an
        initialisation study on kin8nm, power and concrete (:ref:`its figures
        <results-which-starting-values-train-best>`).
        The published start is
        ``noise_variance=0.01, kernel_variance=2.0, lengthscale=2.0, train_mean=False`` with
        ``MeanField(model, inner_variance=1e-5)``. Both assume standardised X and y.

        :param X, y: ``(N, D)`` inputs and ``(N,)`` targets (probit: labels 0/1, or int/bool),
            tensors or NumPy arrays (read as tensors of their own dtype).
        :param hidden_dim: width of inner layers, default ``min(30, D)``.
        :param likelihood: ``"gaussian"``, ``"studentt"``, ``"probit"`` or an instance.
        :param inducing_scheme: ``"per-layer"`` or ``"propagated"`` (see :class:`DeepGP`).
        :param ard: a lengthscale per input dimension (default) or one per kernel.
        :param train_mean: learn the inner layers' linear means, initialised at the identity/PCA
            maps (default); ``False`` keeps those maps fixed.
        :param kernel_per_output: give each GP of an inner layer its own kernel variance and
            lengthscales (``outputs=`` of :class:`~pyro_dgp.kernels.Stationary`), as GPyTorch's
            DeepGP does; default one kernel per layer. Needs ``inducing_scheme="per-layer"``.
        :param whiten: whitened inducing outputs (default). With
            ``inducing_scheme="propagated"`` the layers whose ``u`` is the next layer's
            inducing inputs always hold ``f(Z)``; the last layer is whitened at its random
            inducing inputs (non-centred) if ``whiten``, else it holds ``f(Z)`` too
            (Ustyuzhaninov et al. 2020, §4.2 as published). See :class:`DeepGP`.
        """
        X, y = as_tensor_input(X), as_tensor_input(y, getattr(X, "device", None))
        inducing_scheme = _scheme(inducing_scheme, "DeepGP.regression")
        checked = check_regression_arguments(
            X, y, num_layers, hidden_dim, num_inducing, kernel, likelihood, noise_variance, seed,
            flags={"whiten": whiten, "ard": ard, "train_mean": train_mean,
                   "kernel_per_output": kernel_per_output})
        with default_dtype(X.dtype):
            lik = make_likelihood(likelihood, checked.pop("noise_variance"))
            layers = dsvi_layers(X, kernel=kernel, inner_noise=inner_noise, jitter=jitter,
                                 kernel_variance=kernel_variance, lengthscale=lengthscale,
                                 inducing_scheme=inducing_scheme, **checked)
            model = cls(layers, lik, X.shape[0], name, inducing_scheme)
        return model.to(device=X.device, dtype=X.dtype)

    @classmethod
    def classification(cls, X: torch.Tensor, y: torch.Tensor, **kwargs) -> DeepGP:
        """A deep GP with a Bernoulli-probit likelihood; ``y`` ``(N,)`` holds labels 0/1
        (floating-point, integer or boolean: read in ``X``'s dtype and device).

        Takes the keyword arguments of :meth:`regression` except ``likelihood``.
        """
        if "likelihood" in kwargs:
            raise TypeError("classification() sets the likelihood itself (Bernoulli-probit)")
        return cls.regression(X, y, likelihood="probit", **kwargs)
