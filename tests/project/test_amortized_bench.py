"""``benchmarks/amortized.py`` end to end on tiny settings: runs, resume, records, the report."""

import json
import sys
from pathlib import Path

import pytest
from uci_data import data_root, needs_uci

DATA = data_root("kin8nm") or Path("UCI data not found")
needs_kin8nm = needs_uci("kin8nm")

TINY = ["--epochs", "1", "--batch-size", "4000", "--paths", "4", "--test-samples", "3",
        "--dsdgp-particles", "2", "--dsdgp-inducing", "6", "4", "4", "--widths", "3", "2",
        "--quiet", "--threads", "1"]


@needs_kin8nm
def test_runs_resume_and_land_in_the_report(tmp_path, monkeypatch):
    import amortized
    import report
    import results

    monkeypatch.setenv("PYRO_DGP_RESULTS_DIR", str(tmp_path / "results"))
    out = tmp_path / "runs.jsonl"
    args = ["--datasets", "kin8nm", "--splits", "0", "--methods", "dsdgp", "ar2pp",
            "--speed-sizes", "500", "--data-dir", str(DATA), "--out", str(out), *TINY]
    monkeypatch.setattr(sys, "argv", ["benchmarks/amortized.py", *args])  # the command recorded
    assert amortized.main(args) == 0
    runs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["method"], r["split"]) for r in runs] == [("dsdgp", 0), ("ar2pp", 0)]
    assert runs[1]["components"] == 4  # AR2P/AR2PP predict over their nodes, weighted
    assert all(r["nll"] == r["nll"] and r["s_per_epoch"] > 0 for r in runs)
    recorded = results.read("amortized", tmp_path / "results")
    assert {(r["settings"]["dataset"], r["settings"]["method"]) for r in recorded} == {
        ("kin8nm", "dsdgp"), ("kin8nm", "ar2pp"), ("synthetic", "ar2p")}
    speed = next(r for r in recorded if r["settings"]["dataset"] == "synthetic")
    assert speed["figures"]["steps_per_epoch"] == 1 and speed["settings"]["N"] == 500
    assert amortized.main([*args, "--speed-sizes", "--no-record"]) == 0  # resumes: no rerun
    assert len(out.read_text().splitlines()) == 2
    assert not any(Path(f"{out}.ckpt").glob("*.pt"))  # finished runs leave no checkpoint
    text = report.render(tmp_path / "results")
    assert "## How do amortized guides (Meng and Zhang 2024) compare" in text
    assert "0.066±0.022" in text and "`python benchmarks/amortized.py --datasets kin8nm" in text


@pytest.mark.parametrize("method", ["dsdgp", "ar2pp"])
def test_a_resumed_run_continues_exactly(tmp_path, method):
    """Two epochs, then a fresh process's model resumed from the checkpoint for the third,
    end where three epochs in one go end: same loss, same parameters, bit for bit."""
    import amortized
    import torch

    args = amortized.build_parser().parse_args([*TINY, "--batch-size", "64"])
    X, y = amortized.synthetic(200, 3, 0, torch.device("cpu"), torch.float64)

    def run(epochs, ckpt):
        model, guide, objective, _ = amortized.build(method, X, y, args, 0)
        seconds, loss, _ = amortized.train(model, guide, objective, X, y, args, 0, epochs, "t",
                                           ckpt)
        return len(seconds), loss, {**model.state_dict(), **{
            f"guide.{k}": v for k, v in guide.state_dict().items()}}

    epochs, loss, state = run(3, None)
    ckpt = tmp_path / "run.pt"
    assert run(2, ckpt)[0] == 2 and ckpt.exists()
    resumed_epochs, resumed_loss, resumed_state = run(3, ckpt)
    assert (resumed_epochs, resumed_loss) == (epochs, loss)
    assert state.keys() == resumed_state.keys()
    assert all(torch.equal(state[k], resumed_state[k]) for k in state)
    # a different setting is a different run: it does not pick this checkpoint up
    other = amortized.build_parser().parse_args([*TINY, "--lr", "0.01", "--out", "x"])
    same = amortized.build_parser().parse_args([*TINY, "--out", "x"])
    assert (amortized.checkpoint_path(other, "kin8nm", method, 0)
            != amortized.checkpoint_path(same, "kin8nm", method, 0))
