"""The command line end to end on tiny settings."""

import json
import os
from pathlib import Path

import pytest

from pyro_dgp.cli import main

_SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
DATA = Path(os.environ.get("PYRO_DGP_DATA", _SHARED))
needs_uci = pytest.mark.skipif(
    not (DATA / "uci" / "bostonHousing").exists() and not (DATA / "bostonHousing").exists(),
    reason="UCI data not found (set PYRO_DGP_DATA)",
)


def test_demo_runs_and_writes_results(tmp_path, capsys):
    assert main(["demo", "--steps", "30", "--output", str(tmp_path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "DGP 2" in out and "nll" in out
    rows = json.loads((tmp_path / "results.json").read_text())
    assert len(rows) == 3 and all("rmse" in r for r in rows)
    assert (tmp_path / "predictions.png").stat().st_size > 1000
    pngs = sorted(p.name for p in tmp_path.glob("2layer_meanfield_*.png"))
    assert len(pngs) >= 3 and all((tmp_path / p).stat().st_size > 1000 for p in pngs)
    assert (tmp_path / "2layer_meanfield_datatree.nc").exists()


@needs_uci
def test_fit_then_evaluate_reproduces_the_numbers(tmp_path, capsys):
    args = ["fit", "--data", "boston", "--data-dir", str(DATA), "--layers", "2",
            "--inducing", "10", "--steps", "20", "--batch-size", "64", "--samples", "5",
            "--output", str(tmp_path), "--quiet"]
    assert main(args) == 0
    fitted = json.loads((tmp_path / "metrics.json").read_text())
    capsys.readouterr()
    assert main(["evaluate", str(tmp_path / "fit.pt"), "--data-dir", str(DATA),
                 "--samples", "5"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    for k in ("nll", "rmse", "crps", "coverage95"):
        assert evaluated[k] == pytest.approx(fitted[k], rel=1e-9), k
    assert main(["evaluate", str(tmp_path / "fit.pt"), "--data-dir", str(DATA),
                 "--samples", "5", "--plots", str(tmp_path / "plots")]) == 0
    assert list((tmp_path / "plots").glob("*.png"))  # 13-D inputs: the hyperparameter plot
    assert (tmp_path / "plots" / "datatree.nc").exists()


@needs_uci
def test_bench_uci_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert main(["bench", "uci", "--datasets", "boston", "--layers", "2", "--splits", "1",
                 "--steps", "3", "--samples", "3", "--inducing", "5", "--data-dir", str(DATA),
                 "--out", str(out), "--checkpoint-dir", str(tmp_path / "ck"), "--quiet"]) == 0
    assert len(out.read_text().splitlines()) == 1


def test_bench_compositional_from_the_command_line(tmp_path):
    assert main(["bench", "compositional", "--trials", "1", "--steps", "3", "--families",
                 "mean-field", "chain", "inducing-as-locations (whitened last layer)",
                 "--out", str(tmp_path)]) == 0
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 3
    assert (tmp_path / "layer_paths.png").stat().st_size > 1000
    # resumable: the same command runs nothing again; --first-trial adds the next seed
    args = ["bench", "compositional", "--steps", "3", "--families", "mean-field",
            "--out", str(tmp_path)]
    assert main(args + ["--trials", "1"]) == 0
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 3
    assert main(args + ["--trials", "1", "--first-trial", "1"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [(r["family"], r["trial"]) for r in rows] == [
        ("mean-field", 0), ("chain", 0), ("inducing-as-locations (whitened last layer)", 0),
        ("mean-field", 1)]


def test_fit_with_a_csv_and_a_bad_target_names_the_column(tmp_path, capsys):
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,target\n" + "\n".join(f"{i},{i % 3},{i * 0.1}" for i in range(40)))
    code = main(["fit", "--data", str(csv), "--target", "nope", "--steps", "2",
                 "--output", str(tmp_path / "o"), "--quiet"])
    assert code == 2
    assert "nope" in capsys.readouterr().err
    assert main(["fit", "--data", str(csv), "--target", "target", "--steps", "5",
                 "--inducing", "5", "--samples", "3", "--output", str(tmp_path / "o"),
                 "--quiet"]) == 0


@pytest.mark.parametrize(
    "argv, word",
    [(["fit", "--data", "boston", "--steps", "0"], "--steps"),
     (["fit", "--data", "boston", "--lr", "-1"], "--lr"),
     (["fit", "--data", "boston", "--guide", "nope"], "--guide"),
     (["demo", "--steps", "-3"], "--steps")],
)
def test_bad_arguments_name_the_argument(argv, word, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert word in capsys.readouterr().err
