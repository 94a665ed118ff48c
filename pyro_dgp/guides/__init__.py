"""Variational guides for models built from GP layers (DESIGN.md contract 1-3)."""

from .base import LayerGuide, LayerSite
from .complete import Completed, complete, inducing_only
from .joint import Chain, Coupled, JointGaussian
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
