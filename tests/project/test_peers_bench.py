"""benchmarks/peers.py (GPyTorch's DeepGP and DSPP beside ours) and its section of the report."""

import importlib
import json
import math

import pytest
import report
import results
import torch


def _peers():
    pytest.importorskip("gpytorch", reason="GPyTorch is not installed (the bench extra)")
    return importlib.import_module("peers")


def test_each_peer_records_finite_figures_once(tmp_path, monkeypatch):
    peers = _peers()
    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path))
    argv = ["--datasets", "step", "--splits", "0", "--steps", "3", "--batch", "40",
            "--inducing", "8", "--threads", "1"]
    assert peers.main(argv) == 0
    recs = results.read(peers.BENCHMARK, tmp_path)
    assert [r["settings"]["peer"] for r in recs] == ["deepgp", "dspp", "ours"]
    for rec in recs:
        assert rec["settings"]["steps"] == 3 and rec["settings"]["inducing"] == 8
        for name in ("test_loglik", "rmse", "crps", "coverage95", "nll_std", "ms_per_step"):
            assert math.isfinite(rec["figures"][name]), (rec["settings"]["peer"], name)
    assert [r["settings"]["hidden_width"] for r in recs[:2]] == [10, 3]
    # recorded runs are skipped: a second invocation adds nothing
    assert peers.main(argv) == 0
    assert len(results.read(peers.BENCHMARK, tmp_path)) == 3


def _one_point():
    x = torch.tensor([[0.3]], dtype=torch.float64)
    return x, torch.tensor([0.7], dtype=torch.float64)


def test_deepgp_predictive_is_the_logsumexp_mixture_of_its_draws():
    peers = _peers()
    import gpytorch

    torch.manual_seed(0)
    model = peers.TutorialDeepGP(1, 2, peers.DEEPGP_WIDTH, 5).double().eval()
    x, y = _one_point()
    peers.gpytorch_predictive(model, x)  # GPyTorch's first call in eval mode fills its caches
    torch.manual_seed(1)
    pred = peers.gpytorch_predictive(model, x)
    torch.manual_seed(1)  # the same draws of the hidden layer
    with (torch.no_grad(), gpytorch.settings.num_likelihood_samples(peers.DEEPGP_SAMPLES),
          gpytorch.settings.fast_computations(log_prob=False, solves=False)):
        per_draw = model.likelihood.log_marginal(y, model(x))  # (S, 1)
    S = per_draw.shape[0]
    assert S == peers.DEEPGP_SAMPLES == pred.num_samples
    expected = torch.logsumexp(per_draw, 0) - math.log(S)
    torch.testing.assert_close(pred.log_prob(y), expected)


def test_dspp_predictive_weights_its_sites_by_the_quadrature_weights():
    peers = _peers()
    import gpytorch

    torch.manual_seed(0)
    x, y = _one_point()
    model = peers.TutorialDSPP(torch.randn(5, 1, dtype=torch.float64), 2, peers.DSPP_WIDTH, 5,
                               peers.DSPP_SITES).double().eval()
    with torch.no_grad():
        model.raw_quad_weights.copy_(torch.linspace(-1, 1, peers.DSPP_SITES))
        peers.gpytorch_predictive(model, x)  # GPyTorch's first call in eval mode fills caches
        pred = peers.gpytorch_predictive(model, x)
        with gpytorch.settings.fast_computations(log_prob=False, solves=False):
            per_site = model.likelihood.log_marginal(y, model(x))  # (Q, 1)
        expected = torch.logsumexp(model.quad_weights.unsqueeze(-1) + per_site, 0)
    torch.testing.assert_close(pred.log_prob(y), expected)


def _record(tmp_path, split, peer, loglik, date):
    rec = results.record("uci_gpytorch", {"dataset": "kin8nm", "split": split, "peer": peer,
                                           "layers": 2, "steps": 3000},
                         {"test_loglik": loglik, "rmse": 0.1, "nll_std": -loglik,
                          "ms_per_step": 5.0, "num_splits": 20},
                         command="python benchmarks/peers.py --splits 0 1", results_dir=tmp_path)
    lines = (tmp_path / "uci_gpytorch.jsonl").read_text().splitlines()
    rec["date"] = date
    lines[-1] = json.dumps(rec, sort_keys=True)
    (tmp_path / "uci_gpytorch.jsonl").write_text("\n".join(lines) + "\n")


def test_report_shows_each_peer_as_the_mean_over_its_latest_splits(tmp_path):
    _record(tmp_path, 0, "dspp", 5.0, "2026-11-01")  # replaced by the rerun of split 0
    _record(tmp_path, 0, "dspp", 1.0, "2026-11-02")
    _record(tmp_path, 1, "dspp", 2.0, "2026-11-02")
    _record(tmp_path, 0, "ours", 1.5, "2026-11-02")
    text = report.render(tmp_path)
    section = text.split("## How accurate is it against GPyTorch at equal steps?")[1]
    section = section.split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| kin8nm")]
    # the standard error over splits 0 and 1 of (1, 2): sd 0.7071 / sqrt(2) = 0.5
    assert rows[0].startswith("| kin8nm, 2, 3000 | dspp | 2/20 | 1.5 (0.5) | 0.1 (0.0) |")
    assert rows[1].startswith("| kin8nm, 2, 3000 | ours | 1/20 | 1.5 | 0.1 | -1.5 | 5.0 |")
    assert len(rows) == 2 and rows[0].count("|") == 9  # 8 columns


def test_deepgp_shared_kernel_has_one_kernel_per_hidden_layer():
    peers = _peers()
    torch.manual_seed(0)
    tutorial = peers.TutorialDeepGP(3, 2, peers.DEEPGP_WIDTH, 5)
    shared = peers.TutorialDeepGP(3, 2, peers.DEEPGP_WIDTH, 5, shared_kernel=True)
    lengthscale = lambda m: m.layers[0].covar_module.base_kernel.lengthscale  # noqa: E731
    assert lengthscale(tutorial).shape == (peers.DEEPGP_WIDTH, 1, 3)
    assert lengthscale(shared).shape == (1, 3)
    # the last layer is one GP either way
    assert shared.layers[1].covar_module.base_kernel.lengthscale.shape == (1, peers.DEEPGP_WIDTH)
    out = shared(torch.randn(4, 3))  # the shared kernel broadcasts over the layer's GPs
    assert out.mean.shape[-1] == 4
    assert peers.hidden_width("deepgp-shared") == peers.DEEPGP_WIDTH


def test_ours_per_output_fits_a_kernel_per_hidden_gp(tmp_path, monkeypatch):
    peers = _peers()
    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path))
    argv = ["--datasets", "step", "--splits", "0", "--steps", "2", "--batch", "40",
            "--inducing", "8", "--threads", "1", "--peers", "ours-per-output"]
    assert peers.main(argv) == 0
    (rec,) = results.read(peers.BENCHMARK, tmp_path)
    assert rec["settings"]["peer"] == "ours-per-output" and "particles" in rec["settings"]
    args = peers.build_parser().parse_args(argv)
    data = peers._load("step", 0, args)
    model = peers._run_ours(data, args, 0, kernel_per_output=True)[2]
    assert model.layers[0].kernel_outputs == model.layers[0].output_dim
    assert model.layers[-1].kernel_outputs is None
