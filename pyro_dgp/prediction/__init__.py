"""The predictive mixture and its scores."""

from . import metrics
from .draw_mixture import DrawMixturePredictive
from .mixture import MixturePredictive, gaussian_mixture_crps
from .predictive import predict

__all__ = ["DrawMixturePredictive", "MixturePredictive", "gaussian_mixture_crps", "metrics",
           "predict"]
