"""The Gaussian-mixture predictive and its scores."""

from . import metrics
from .mixture import MixturePredictive, gaussian_mixture_crps
from .predictive import predict

__all__ = ["MixturePredictive", "gaussian_mixture_crps", "metrics", "predict"]
