"""Variational guides for models built from GP layers (the model/guide contract of
``docs/design.md``)."""

from .base import LayerGuide
from .families.amortized import Amortized
from .families.chain import Chain
from .families.completed import Completed, complete, inducing_only
from .families.coupled import Coupled
from .families.meanfield import MeanField
from .families.mixture import Mixture
from .families.semi_implicit import SemiImplicit
from .gaussian import LayerGaussian
from .joint import JointGaussian
from .mixing import DiscreteMixingNormal, MixingNetwork, ReverseNetwork, SemiImplicitNormal
from .mixture_runs import one_per_mode
from .protocol import GuideProtocol, protocol_of, sample_paths, shared_draws
from .prototype import LayerSite
from .registry import register_guide

__all__ = [
    "Amortized",
    "Chain",
    "Completed",
    "Coupled",
    "DiscreteMixingNormal",
    "GuideProtocol",
    "JointGaussian",
    "LayerGaussian",
    "LayerGuide",
    "LayerSite",
    "MeanField",
    "MixingNetwork",
    "Mixture",
    "ReverseNetwork",
    "SemiImplicit",
    "SemiImplicitNormal",
    "complete",
    "inducing_only",
    "one_per_mode",
    "protocol_of",
    "register_guide",
    "sample_paths",
    "shared_draws",
]
