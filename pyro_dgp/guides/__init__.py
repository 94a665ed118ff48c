"""Variational guides for models built from GP layers (DESIGN.md contract 1-3)."""

from .base import LayerGuide, LayerSite
from .complete import Completed, complete, inducing_only
from .meanfield import MeanField

__all__ = ["LayerGuide", "LayerSite", "MeanField", "Completed", "complete", "inducing_only"]
