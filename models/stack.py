"""Building blocks shared by the gallery: a stack of GP layers and the data plate.

A deep GP is a composition ``f^L(... f^1(x))`` of GP layers (Damianou and Lawrence 2013).
The stack here follows the DSVI architecture of Salimbeni and Deisenroth 2017: inducing
inputs of the first layer at k-means centres of the data, inner layers with a fixed linear
mean (identity or PCA projection) so that a deep GP starts close to a shallow one, and
their inducing inputs propagated through those means; the last layer has a zero mean.
"""

from __future__ import annotations

import itertools

import pyro
import torch
from pyro.nn import PyroModule

import pyro_dgp as dgp
from pyro_dgp.gp.architectures import kmeans, pca_mean
from pyro_dgp.guides.draws import set_up_guide, trace_draws
from pyro_dgp.rng import seeded
from pyro_dgp.validation import unique_name

__all__ = ["StackModel", "data_plate", "function_draws", "gp_stack"]


def gp_stack(X: torch.Tensor, widths: list[int], num_inducing: int, *,
             amortized: bool = False, seed: int = 0, kernel_variance: float = 1.0,
             lengthscale: float = 1.0) -> list[dgp.GPLayer]:
    """GP layers ``widths[0] -> widths[1] -> ... -> widths[-1]``, named ``layer1 ...``.

    :param X: ``(N, widths[0])`` inputs the stack is initialised on (inducing inputs and the
        PCA means); its dtype and device are the layers'.
    :param widths: input width, then each layer's output width.
    :param num_inducing: M per layer, at most N.
    :param amortized: :class:`~pyro_dgp.AmortizedGPLayer`\\ s (per-point inducing points,
        for :class:`~pyro_dgp.guides.Amortized`) instead of :class:`~pyro_dgp.GPLayer`\\ s.
    :returns: the layers, first to last.
    """
    if X.dim() != 2 or X.shape[-1] != widths[0]:
        raise ValueError(f"gp_stack: X must have shape (N, {widths[0]}), got "
                         f"{tuple(X.shape)}")
    if len(widths) < 2:
        raise ValueError(f"gp_stack: widths needs an input and at least one layer, got "
                         f"{widths}")
    if not 1 <= num_inducing <= X.shape[0]:
        raise ValueError(f"gp_stack: num_inducing must lie in [1, N={X.shape[0]}], got "
                         f"{num_inducing}")
    Z, H = kmeans(X, num_inducing, seed), X.detach()
    layers = []
    for i, (d_in, d_out) in enumerate(itertools.pairwise(widths)):
        last = i == len(widths) - 2
        kern = dgp.kernels.RBF(d_in, variance=X.new_tensor(kernel_variance),
                               lengthscale=X.new_tensor(lengthscale))
        mean = "zero" if last else pca_mean(H, d_out)
        name = f"layer{i + 1}"
        if amortized:
            layer = dgp.AmortizedGPLayer(d_in, d_out, inducing_offsets=Z - Z.mean(0),
                                         kernel=kern, mean=mean, name=name)
        else:
            layer = dgp.GPLayer(d_in, d_out, inducing_points=Z, kernel=kern, mean=mean,
                                name=name)
        layers.append(layer)
        if not last:  # the next layer's inputs start near this layer's mean function
            Z, H = Z @ mean, H @ mean
    return layers


def data_plate(num_data: int | None, batch: torch.Tensor) -> pyro.plate:
    """The data plate over a minibatch of a data set of ``num_data`` points (``None``: the
    minibatch is all of it), so that Pyro scales every site inside by ``N / B``
    (``docs/design.md``, subsampling).

    :param batch: ``(B, D)`` the minibatch (inputs, or the observations of a latent-input
        model); only its size and device are read.
    """
    B = batch.shape[-2]
    N = num_data if num_data is not None and num_data >= B else B
    return pyro.plate("data", N, subsample=torch.arange(B, device=batch.device), dim=-1)


def function_draws(guide, X: torch.Tensor, site: str, num_samples: int,
                   seed: int | None = 0, *args) -> torch.Tensor:
    """``(S, N, D_out)`` draws of the function values ``site`` (e.g. ``"layer2.f"``) at ``X``
    from ``num_samples`` draws of a layer guide, one ``U`` per draw for all points, each
    ``f`` from the guide's estimator (per point: the right draws for pointwise predictive
    quantities). ``args`` follow ``X`` in the model's call. Leaves the global random state
    as it was when ``seed`` is given."""
    set_up_guide(guide, (X, *args), seed, X.device)
    with torch.no_grad(), seeded(seed, X.device):
        trace = trace_draws(guide, (X, *args), num_samples)
    if site not in trace.nodes:
        raise ValueError(f"function_draws: the guide has no site {site!r}; its sites: "
                         f"{[n for n in trace.nodes if n.endswith('.f')]}")
    value = trace.nodes[site]["value"]
    return value.reshape(num_samples, X.shape[-2], value.shape[-1])


class StackModel(PyroModule):
    """The part every gallery model shares: its GP layers (``.layers``, :func:`gp_stack` of
    ``widths``), the data set's size ``num_data`` (``pyro_dgp.fit`` sets it), a unique Pyro
    name (two models never share parameters in Pyro's param store) and ``example_args()``
    (guides build their parameters from one run on it). A model adds its observation in
    ``forward``, after :meth:`propagate`.

    :param X: ``(N, widths[0])`` the inputs the layers are initialised on.
    """

    def __init__(self, X: torch.Tensor, widths: list[int], num_inducing: int,
                 amortized: bool = False):
        super().__init__(name=unique_name(type(self).__name__))
        self.layers = PyroModule[torch.nn.ModuleList](
            gp_stack(X, widths, num_inducing, amortized=amortized))
        self.num_data = X.shape[0]

    def example_args(self) -> tuple[torch.Tensor]:
        """One input row of zeros."""
        Z = self.layers[0].inducing_points.detach()
        return (Z.new_zeros(1, self.layers[0].input_dim),)

    def propagate(self, h: torch.Tensor, plate: pyro.plate) -> torch.Tensor:
        """``f^L(... f^1(h))``: each layer samples ``<layer>.u``, then ``<layer>.f`` at its
        inputs in ``plate``. ``(..., B, D) -> (..., B, D_L)``."""
        for layer in self.layers:
            h = layer(h, plate=plate)
        return h
