"""Variational guides for models built from GP layers (the model/guide contract of
``docs/design.md``)."""

from .amortized import Amortized
from .base import LayerGuide, sample_paths, shared_draws
from .chain import Chain
from .completed import Completed, complete, inducing_only
from .coupled import Coupled
from .gaussian import LayerGaussian
from .joint import JointGaussian
from .meanfield import MeanField
from .mixing import MixingNetwork, SemiImplicitNormal
from .mixture import Mixture
from .prototype import LayerSite
from .semi_implicit import SemiImplicit

__all__ = [
    "Amortized",
    "Chain",
    "Completed",
    "Coupled",
    "JointGaussian",
    "LayerGaussian",
    "LayerGuide",
    "LayerSite",
    "MeanField",
    "MixingNetwork",
    "Mixture",
    "SemiImplicit",
    "SemiImplicitNormal",
    "complete",
    "inducing_only",
    "sample_paths",
    "shared_draws",
]
