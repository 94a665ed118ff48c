"""What the command line says about a bad device, a fit evaluated on other data or given as a
training checkpoint, and the defaults in its help."""

import re

import pytest
import torch

from pyro_dgp.cli import build_parser, main


def _csv(path):
    g = torch.Generator().manual_seed(0)
    X = torch.rand(40, 2, generator=g, dtype=torch.float64)
    rows = [f"{a:.6f},{b:.6f},{a + b * b:.6f}" for a, b in X.tolist()]
    path.write_text("a,b,target\n" + "\n".join(rows) + "\n")
    return path


@pytest.fixture
def fitted(tmp_path, capsys):
    """A fit of a CSV file with 2 inputs: ``(folder, csv)``."""
    csv = _csv(tmp_path / "d.csv")
    assert main(["fit", "--data", str(csv), "--target", "target", "--num-inducing", "4",
                 "--steps", "2", "--samples", "2", "--output", str(tmp_path / "o"),
                 "--quiet"]) == 0
    capsys.readouterr()
    return tmp_path / "o", csv


@pytest.mark.parametrize("device, reason", [
    ("cuda", "no cuda device is available"),
    ("cuda:0", "no cuda device is available"),
    ("foo", "'foo' is not a torch device"),
    ("meta", "holds no data"),
])
def test_a_device_this_machine_lacks_is_an_option_error(tmp_path, monkeypatch, capsys, device,
                                                       reason):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--data", "step", "--steps", "1", "--device", device, "--output",
              str(tmp_path), "--quiet"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument --device" in err and reason in err
    assert "Traceback" not in err


def test_evaluate_names_a_saved_device_this_machine_lacks(fitted, monkeypatch, capsys):
    out, _ = fitted
    state = torch.load(out / "fit.pt", weights_only=True)
    state["config"]["device"] = "cuda"
    torch.save(state, out / "gpu.pt")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["evaluate", str(out / "gpu.pt")]) == 2
    err = capsys.readouterr().err
    assert "the fit was saved with --device cuda" in err and "pass --device cpu" in err
    assert main(["evaluate", str(out / "gpu.pt"), "--device", "cpu"]) == 0


def test_evaluate_on_data_with_other_inputs_names_both_counts(fitted, capsys):
    out, csv = fitted
    assert main(["evaluate", str(out / "fit.pt"), "--data", "step"]) == 2
    err = capsys.readouterr().err
    assert f"the fit has 2 inputs, step has 1: evaluate it on the data it was fitted to " \
           f"({csv.resolve()})" in err


def test_evaluate_of_a_training_checkpoint_says_which_file_to_pass(fitted, capsys):
    out, _ = fitted
    assert main(["evaluate", str(out / "checkpoint.pt")]) == 2
    err = capsys.readouterr().err
    assert "is a training checkpoint" in err and "not a fit saved by `pyro-dgp fit`" in err
    assert f"pass {str(out / 'fit.pt')!r}" in err
    (out / "fit.pt").unlink()  # no fit beside it: the message says where fit writes one
    assert main(["evaluate", str(out / "checkpoint.pt")]) == 2
    assert "the fit.pt that `pyro-dgp fit` writes to its --output folder" in \
        capsys.readouterr().err


def _option_helps(command) -> dict[str, str]:
    """``{option: its help, on one line}`` from a command's formatted help."""
    text = command.format_help().split("options:", 1)[1]
    entries = re.split(r"\n  (?=-)", "\n" + text)
    return {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries
            if entry.strip()}


@pytest.mark.parametrize("name", ["demo", "fit", "evaluate"])
def test_each_option_shows_one_default(name):
    command = build_parser()._subparsers._group_actions[0].choices[name]
    helps = _option_helps(command)
    assert "--seed" in helps
    for text in helps.values():
        assert text.count("(default") <= 1, text
    if name == "evaluate":
        for option in ("--data", "--split", "--test-fraction", "--data-dir", "--device",
                       "--dtype", "--samples", "--seed"):
            assert helps[option].endswith("(default: the fit's)"), helps[option]
    if name == "fit":
        assert helps["--split"].endswith("(default: 0; for a CSV file, --seed)")
        assert helps["--device"].endswith("(default: cpu)")


_TINY = ["--data", "step", "--num-inducing", "5", "--steps", "2", "--samples", "2", "--quiet"]


def test_alpha_without_the_alpha_objective_is_refused(tmp_path, capsys):
    assert main(["fit", *_TINY, "--alpha", "0.3", "--output", str(tmp_path)]) == 2
    assert "--alpha 0.3 sets the alpha of --objective alpha, not of --objective auto" in (
        capsys.readouterr().err)
    assert not (tmp_path / "fit.pt").exists()


@pytest.mark.parametrize("option, value", [("--alpha", "0"), ("--alpha", "1.5"),
                                           ("--natural-gradient", "0"),
                                           ("--natural-gradient", "2")])
def test_alpha_and_gamma_outside_the_unit_interval_are_option_errors(option, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["fit", *_TINY, "--objective", "alpha", option, value])
    assert exc.value.code == 2
    assert f"{option}: must lie in (0, 1], got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("guide, reason", [
    ("autonormal", "--guide autonormal (Completed) has none: use one of meanfield, "
                   "meanfield-sampled, coupled, coupled-per-point"),
    ("sivi", "--guide sivi (SemiImplicit) has none"),
    ("coupled-lowrank", "does not apply to --guide coupled-lowrank: Coupled(rank="),
])
def test_natural_gradient_is_refused_for_guides_without_gaussian_blocks(tmp_path, capsys, guide,
                                                                       reason):
    assert main(["fit", *_TINY, "--guide", guide, "--natural-gradient", "0.1", "--output",
                 str(tmp_path)]) == 2
    assert reason in capsys.readouterr().err
    assert not (tmp_path / "fit.pt").exists()
