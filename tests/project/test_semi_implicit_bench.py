"""``benchmarks/semi_implicit.py`` end to end at a tiny size: one record per method, with the
distances, the ELBO and the mode masses, appended to the results; and the UCI part's lines."""

import json
import math

import pyro
import pytest
import results
import semi_implicit as bench
import torch

from pyro_dgp import fit, gold, predict
from pyro_dgp.guides.registry import make_guide

DT = torch.float64
NUTS_DRAWS = 4  # --nuts-chains 1 --nuts-samples 4
GUIDE_DRAWS = 2000  # the benchmark's draws of f^1(x*) per guide


def _is_multiple(mass: float, n: int) -> bool:
    """Whether ``mass`` is a fraction ``k / n`` of ``n`` draws."""
    return abs(mass * n - round(mass * n)) < 1e-9


def test_toy_part_records_nuts_and_each_guide():
    argv = ["--part", "toys", "--toys", "two_mode", "--guides", "meanfield", "ssivi",
            "--steps", "3", "--nuts-chains", "1", "--nuts-warmup", "3", "--nuts-samples", "4",
            "--samples", "8", "--elbo-particles", "2", "--grid", "5", "--no-figures",
            "--quiet"]
    assert bench.main(argv) == 0
    recs = results.read("semi_implicit")[-3:]
    assert [r["settings"]["guide"] for r in recs] == ["nuts", "meanfield", "ssivi"]
    nuts, *guides = recs
    assert nuts["settings"]["chains"] == 1 and "divergences" in nuts["figures"]
    for rec, n in ((nuts, NUTS_DRAWS), *((g, GUIDE_DRAWS) for g in guides)):
        f = rec["figures"]
        # each mode's mass is a fraction of the draws of f^1(x*); the dead zone holds the rest
        assert 0 <= f["mode_A"] + f["mode_B"] <= 1, f
        assert all(0 <= f[k] <= 1 and _is_multiple(f[k], n) for k in ("mode_A", "mode_B")), f
    for rec in guides:
        f = rec["figures"]
        assert rec["settings"]["toy"] == "two_mode" and rec["settings"]["steps"] == 3
        for key in ("mean_abs", "log_var_abs", "w1", "w1_layer1", "elbo", "s_per_step"):
            assert math.isfinite(f[key]) and (key == "elbo" or f[key] >= 0), (key, f)
        assert rec["command"].startswith("python ")

    # The same reference and the same guide again, by the library at the benchmark's seed:
    # the records are NUTS's mode masses of its own draws and the guide's distances to it.
    model, X, y = gold.two_mode_model(noise=1e-2)
    grid = torch.linspace(-1.5, 1.5, 5, dtype=DT).unsqueeze(-1)
    x_star = X.new_tensor([[gold.TWO_MODE_INPUT]])
    reference = gold.run_nuts(model, X, y, target="elbo_optimum", num_samples=4,
                              warmup_steps=3, num_chains=1,
                              seed=0, full_mass=True, progress=False)
    b, a = gold.mode_masses(reference.layer_values(x_star, "layer1"))
    assert (nuts["figures"]["mode_A"], nuts["figures"]["mode_B"]) == (a, b)
    assert nuts["figures"]["divergences"] == sum(reference.divergences)
    pyro.set_rng_seed(0)
    guide = make_guide("meanfield", model)
    with gold.fixed_hyperparameters(model):
        fit(model, guide, X, y, num_steps=3, lr=5e-3, seed=0, progress=False,
            final_elbo_particles=2, lr_schedule="constant")  # as the benchmark trains
    distance = gold.predictive_distance(reference.predict(grid, seed=0),
                                        predict(model, guide, grid, num_samples=8, seed=0),
                                        seed=0)
    f = guides[0]["figures"]
    assert {k: f[k] for k in ("mean_abs", "log_var_abs", "w1")} == distance.as_dict()
    b, a = gold.mode_masses(gold.guide_layer_values(model, guide, x_star, "layer1",
                                                    num_samples=GUIDE_DRAWS, seed=0))
    assert (f["mode_A"], f["mode_B"]) == (a, b)


@pytest.mark.usefixtures("boston_data")
def test_uci_part_records_one_line_per_guide(tmp_path):
    argv = ["--part", "uci", "--datasets", "boston", "--uci-guides", "meanfield", "ssivi",
            "--splits", "1", "--uci-steps", "2", "--work-dir", str(tmp_path), "--quiet"]
    assert bench.main(argv) == 0
    recs = results.read("semi_implicit")[-2:]
    assert [r["settings"]["guide"] for r in recs] == ["meanfield", "ssivi"]
    runs = [json.loads(line) for line in (tmp_path / "uci_runs.jsonl").read_text().splitlines()]
    assert [(r["guide"], r["split"], r["status"]) for r in runs] == [
        ("meanfield", 0, "ok"), ("ssivi", 0, "ok")]
    for rec, run in zip(recs, runs, strict=True):
        s, f = rec["settings"], rec["figures"]
        assert (s["dataset"], s["model"], s["steps"], s["toy"]) == ("boston", "DGP 2", 2, None)
        assert (f["splits"], f["diverged"], f["num_splits"]) == (1, 0, 20)
        # one split: its own scores, and no standard error
        assert math.isfinite(f["test_loglik"]) and f["test_loglik"] == run["metrics"][
            "test_loglik"]
        assert f["rmse"] == run["metrics"]["rmse"] > 0
        assert f["test_loglik_se"] is None and f["rmse_se"] is None
        assert f["s_per_step"] == run["seconds_per_step"] > 0
        assert run["steps_done"] == 2 and run["layers"] == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_device_is_refused(capsys):
    assert bench.main(["--part", "toys", "--device", "cuda"]) == 2
    assert "CUDA" in capsys.readouterr().err


def test_toy_part_runs_the_other_semi_implicit_options():
    # ssivi-init trains a MeanField guide first and starts SSIVI at its q(u)
    argv = ["--part", "toys", "--toys", "two_mode", "--guides", *bench.EXTRA_GUIDES,
            "--steps", "3", "--nuts-chains", "1", "--nuts-warmup", "3", "--nuts-samples", "4",
            "--samples", "8", "--elbo-particles", "2", "--grid", "5", "--no-figures",
            "--quiet"]
    assert bench.main(argv) == 0
    recs = results.read("semi_implicit")[-len(bench.EXTRA_GUIDES):]
    assert [r["settings"]["guide"] for r in recs] == list(bench.EXTRA_GUIDES)
    for rec in recs:
        f = rec["figures"]
        assert math.isfinite(f["elbo"]) and 0 <= f["mode_A"] + f["mode_B"] <= 1, f
