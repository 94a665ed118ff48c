"""Variational guides for models built from GP layers (DESIGN.md contract 1-3)."""

from .base import LayerGuide, LayerSite
from .chain import Chain
from .completed import Completed, complete, inducing_only
from .coupled import Coupled
from .joint import JointGaussian
from .meanfield import MeanField

__all__ = [
    "Chain",
    "Completed",
    "Coupled",
    "JointGaussian",
    "LayerGuide",
    "LayerSite",
    "MeanField",
    "complete",
    "inducing_only",
]
