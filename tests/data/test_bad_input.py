"""Kernels and likelihoods given bad settings (non-finite, wrongly shaped hyperparameters) refuse
them naming the class and the argument; bare modules keep their own parameters."""

import math

import pyro
import pytest
import torch

import pyro_dgp as dgp
from pyro_dgp import kernels as K
from pyro_dgp.likelihoods import Gaussian, StudentT

DT = torch.float64


def _layer(**kw):
    return dgp.GPLayer(1, 1, inducing_points=torch.zeros(3, 1, dtype=DT), **kw)


def test_bare_kernels_and_likelihoods_do_not_share_parameters():
    X = torch.tensor([[0.0], [1.0]])
    k1, k2 = K.RBF(1, lengthscale=0.5), K.RBF(1, lengthscale=2.0)
    assert math.isclose(k1(X)[0, 1].item(), math.exp(-2), rel_tol=1e-6)
    assert math.isclose(k2(X)[0, 1].item(), math.exp(-1 / 8), rel_tol=1e-6)
    g1, g2 = Gaussian(0.01), Gaussian(1.0)
    f = torch.zeros(3, 1)
    with pyro.plate("data", 3, dim=-1):
        g1(f)
        g2(f, name="y2")
    assert math.isclose(g2.variance.item(), 1.0, rel_tol=1e-6)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: K.RBF(2, variance=math.inf), "RBF: variance"),
        (lambda: K.RBF(2, lengthscale=math.inf), "RBF: lengthscale"),
        (lambda: K.Periodic(2, period=math.inf), "Periodic: period"),
        (lambda: K.White(2, variance=math.inf), "White: variance"),
        (lambda: Gaussian(math.inf), "Gaussian: variance"),
        (lambda: StudentT(scale=math.inf), "StudentT: scale"),
        (lambda: StudentT(df=math.inf), "StudentT: df"),
        (lambda: _layer(jitter=math.inf), "GPLayer: jitter"),
    ],
)
def test_inf_settings_are_rejected(make, match):
    with pytest.raises(ValueError, match=f"{match} must be positive and finite, got inf"):
        make()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: K.RBF(2, lengthscale=[1.0, 2.0, 3.0]),
         r"RBF: lengthscale must be a scalar or of shape \(2,\), got shape \(3,\)"),
        (lambda: K.Periodic(2, period=[1.0, 2.0, 3.0]), r"Periodic: period must be a scalar"),
        (lambda: K.RBF(2, lengthscale=[1.0, 2.0], ard=False),
         r"lengthscale must be a scalar \(ard=False\), got shape \(2,\)"),
        (lambda: K.RBF(2, variance=[1.0, 2.0]), r"RBF: variance must be a scalar"),
        (lambda: Gaussian(torch.tensor([0.1, 0.2])), r"Gaussian: variance must be a scalar"),
    ],
)
def test_hyperparameter_shapes_are_checked(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_scalar_and_ard_hyperparameters_still_accepted():
    assert K.RBF(2, lengthscale=[1.0, 2.0]).lengthscale.shape == (2,)
    assert K.RBF(2, lengthscale=1.5).lengthscale.shape == (2,)
    assert K.RBF(2, lengthscale=1.5, ard=False).lengthscale.shape == ()
    assert K.RBF(2, variance=torch.tensor([2.0])).variance.shape == ()
