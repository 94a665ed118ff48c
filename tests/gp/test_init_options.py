"""DeepGP.regression's initialisation options: isotropic kernels and learned linear means."""

import pyro
import torch

import pyro_dgp as dgp


def test_isotropic_kernels_and_learned_means():
    torch.manual_seed(0)
    X = torch.randn(40, 3, dtype=torch.float64)
    y = X[:, 0].sin()
    pyro.clear_param_store()
    ard = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6, train_mean=False)
    iso = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=6, ard=False)  # learned means
    assert ard.layers[1].kernel.lengthscale.numel() == 3  # ARD over the 3 hidden units
    assert iso.layers[1].kernel.lengthscale.numel() == 1
    names = {n for n, _ in iso.named_parameters()}
    assert any("layers.0.mean_weight" in n for n in names)  # the inner linear mean, learned
    assert not any("mean_weight" in n for n, _ in ard.named_parameters())  # fixed: a buffer
    torch.testing.assert_close(iso.layers[0].mean_weight.detach(), ard.layers[0].mean_weight)
    # it trains: a fit moves it
    before = iso.layers[0].mean_weight.detach().clone()
    dgp.fit(iso, dgp.guides.MeanField(iso), X, y, num_steps=5, lr=0.05, progress=False,
            final_elbo_particles=0)
    assert not torch.allclose(iso.layers[0].mean_weight.detach(), before)
