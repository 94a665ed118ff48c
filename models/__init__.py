"""A gallery of deep GP models written as plain Pyro ``PyroModule``\\ s of GP layers.

Each module is one model, with its sites and the guides that fit it in its docstring:

- :mod:`models.regression`: ``RegressionDGP`` (Gaussian), and ``DGP`` for any
  single-output likelihood;
- :mod:`models.classification`: ``ProbitDGP`` (binary), ``MulticlassDGP`` (softmax);
- :mod:`models.poisson`: ``PoissonDGP`` with a closed-form analytic last layer;
- :mod:`models.heteroscedastic`: ``HeteroscedasticDGP``, a second output for the log noise;
- :mod:`models.neural`: ``FeatureDGP``, GP layers on an ``nn.Module`` feature map;
- :mod:`models.latent_input`: ``LatentInputDGP`` with ``LatentInputGuide`` (GP-LVM inputs
  with an amortized encoder);
- :mod:`models.multi_output`: ``MultiOutputDGP``, outputs sharing the inner layers;
- :mod:`models.stack`: what they share: the layer stack (``StackModel``, ``gp_stack``), the
  data plate and draws of a layer's function values.

The folder sits beside ``pyro_dgp/`` and is not installed: import it with the repository root
on ``sys.path`` (running from the root does that). ``pyro_dgp`` never imports it.
"""

from .classification import MulticlassDGP, ProbitDGP, class_probabilities
from .heteroscedastic import HeteroscedasticDGP, noise_std
from .latent_input import LatentInputDGP, LatentInputGuide
from .multi_output import MultiOutputDGP, predictive_mean
from .neural import FeatureDGP, mlp
from .poisson import Poisson, PoissonDGP
from .regression import DGP, RegressionDGP
from .stack import StackModel, data_plate, function_draws, gp_stack

__all__ = [
    "DGP",
    "FeatureDGP",
    "HeteroscedasticDGP",
    "LatentInputDGP",
    "LatentInputGuide",
    "MultiOutputDGP",
    "MulticlassDGP",
    "Poisson",
    "PoissonDGP",
    "ProbitDGP",
    "RegressionDGP",
    "StackModel",
    "class_probabilities",
    "data_plate",
    "function_draws",
    "gp_stack",
    "mlp",
    "noise_std",
    "predictive_mean",
]
