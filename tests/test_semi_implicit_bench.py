"""``benchmarks/semi_implicit.py`` end to end at a tiny size: one record per method, with the
distances, the ELBO and the mode masses, appended to the results."""

import math

import pytest
import results
import semi_implicit as bench
import torch


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
    for rec in guides:
        f = rec["figures"]
        assert rec["settings"]["toy"] == "two_mode" and rec["settings"]["steps"] == 3
        for key in ("mean_abs", "log_var_abs", "w1", "elbo", "s_per_step"):
            assert math.isfinite(f[key]) and (key == "elbo" or f[key] >= 0), (key, f)
        assert 0 <= f["mode_A"] + f["mode_B"] <= 1
        assert rec["command"].startswith("python ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_device_is_refused(capsys):
    assert bench.main(["--part", "toys", "--device", "cuda"]) == 2
    assert "CUDA" in capsys.readouterr().err
