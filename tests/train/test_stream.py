"""Streaming data (pyro_dgp.datasets.stream), the minibatches drawn from it
(pyro_dgp.train.batches), the ELBO over chunks (pyro_dgp.train.chunked) and predictions by
chunk (pyro_dgp.prediction.streaming)."""

import math
import re
import sys
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import distributed_worker as worker  # noqa: E402

import pyro_dgp as dgp  # noqa: E402
from pyro_dgp.datasets.moments import RunningMoments  # noqa: E402
from pyro_dgp.datasets.stream import (  # noqa: E402
    ArrayStream,
    DatasetStream,
    IterableStream,
    as_stream,
)
from pyro_dgp.infer.objectives import evaluate_elbo  # noqa: E402
from pyro_dgp.prediction.streaming import predict_chunks, stream_report  # noqa: E402
from pyro_dgp.rng import step_seed  # noqa: E402
from pyro_dgp.train.batches import Batches  # noqa: E402
from pyro_dgp.train.chunked import chunked_elbo  # noqa: E402


def _raw(n=300, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = (rng.normal(size=(n, d)) * [1.0, 5.0, 0.1] + [100.0, -3.0, 0.0]).astype(np.float32)
    y = (X[:, 0] - 100.0 + np.sin(X[:, 1]) + 0.1 * rng.normal(size=n)).astype(np.float32)
    return X, y


@pytest.fixture
def files(tmp_path):
    X, y = _raw()
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    return tmp_path / "X.npy", tmp_path / "y.npy", X, y


# ------------------------------------------------------------------------- running moments
def test_chunked_moments_equal_two_pass_moments_far_from_zero():
    # 1e8 + U(0, 1): the sum of squares is 1e16 per row, so sum x^2 - n mean^2 in float64
    # (eps 2e-16) is off by about n, against a variance of 1/12; Chan's merge is not
    rng = np.random.default_rng(1)
    x = 1e8 + rng.uniform(size=(5000, 2))
    moments = RunningMoments(2)
    for chunk in np.array_split(x, [1, 7, 1000, 1001, 4321]):
        moments.update(chunk)
    assert moments.count == 5000
    np.testing.assert_allclose(moments.mean.numpy(), x.mean(0), rtol=1e-14)
    two_pass = ((x - x.mean(0)) ** 2).mean(0)
    np.testing.assert_allclose(moments.variance.numpy(), two_pass, rtol=1e-8)
    naive = (x**2).mean(0) - x.mean(0) ** 2
    assert np.abs(naive - two_pass).max() > 1e-2  # the textbook formula fails here


def test_moments_merged_in_any_split_or_order_agree():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(999, 3)) * 3 + 7
    whole = RunningMoments(3).update(x)
    parts = [RunningMoments(3).update(p) for p in np.array_split(x, 4)]
    merged = RunningMoments(3)
    for p in reversed(parts):
        merged.merge(p)
    for name in ("mean", "m2", "low", "high"):
        torch.testing.assert_close(getattr(merged, name), getattr(whole, name), rtol=1e-13,
                                   atol=0)
    back = RunningMoments.from_tensor(whole.to_tensor())
    assert back.count == 999 and torch.equal(back.m2, whole.m2)


def test_constant_columns_get_unit_scale_and_bad_chunks_are_refused():
    moments = RunningMoments(2).update(np.array([[0.998, 1.0], [0.998, 3.0]]))
    assert moments.std().tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="NaN or inf"):
        RunningMoments(1).update(np.array([1.0, np.nan]))
    with pytest.raises(ValueError, match="undefined"):
        RunningMoments(1).variance  # noqa: B018


# ------------------------------------------------------------------------- streams
def test_array_stream_standardises_npy_paths_memory_maps_and_arrays_alike(files):
    X_path, y_path, X, y = files
    X64, y64 = X.astype(np.float64), y.astype(np.float64)
    expected_X = (X64 - X64.mean(0)) / X64.std(0)
    expected_y = (y64 - y64.mean()) / y64.std()
    streams = [ArrayStream(X_path, y_path),
               ArrayStream(np.load(X_path, mmap_mode="r"), np.load(y_path, mmap_mode="r")),
               ArrayStream(X, y[:, None])]
    index = np.array([5, 0, 299, 5])
    for stream in streams:
        assert (stream.num_data, stream.num_columns) == (300, 3)
        units = stream.standardization
        np.testing.assert_allclose(units.X_mean.numpy(), X64.mean(0), rtol=1e-13)
        np.testing.assert_allclose(units.X_std.numpy(), X64.std(0), rtol=1e-12)
        assert units.y_std == pytest.approx(y64.std(), rel=1e-12)
        Xr, yr = stream.rows(index)
        assert Xr.dtype == torch.float64 and Xr.shape == (4, 3) and yr.shape == (4,)
        np.testing.assert_allclose(Xr.numpy(), expected_X[index], rtol=0, atol=1e-12)
        np.testing.assert_allclose(yr.numpy(), expected_y[index], rtol=0, atol=1e-12)
        X32, _ = stream.rows(index, dtype=torch.float32)
        assert X32.dtype == torch.float32
    # a slice of a memory map that starts later is read through the map the user gave
    tail = ArrayStream(np.load(X_path, mmap_mode="r")[100:], y[100:], standardize=False)
    np.testing.assert_array_equal(tail.rows([0])[0].numpy(), X64[100:101])


def test_dataset_and_iterable_streams_agree_with_the_array_stream(files):
    X_path, y_path, X, y = files
    reference = ArrayStream(X_path, y_path)
    mapped = DatasetStream(TensorDataset(torch.from_numpy(X), torch.from_numpy(y)))

    class Rows(IterableDataset):
        def __iter__(self):
            return iter(zip(X, y, strict=True))

    iterable = IterableStream(Rows(), num_data=300)
    for stream in (mapped, iterable):
        torch.testing.assert_close(stream.standardization.X_mean,
                                   reference.standardization.X_mean, rtol=1e-13, atol=0)
        assert stream.standardization.y_std == pytest.approx(reference.standardization.y_std,
                                                             rel=1e-12)
    torch.testing.assert_close(mapped.rows([3, 1]), reference.rows([3, 1]))
    # read in order and restarted at the end: 200 + 200 items are rows 0..199, 200..299, 0..99
    first, second = iterable.take(200), iterable.take(200)
    np.testing.assert_array_equal(first[0], X[:200])
    np.testing.assert_array_equal(second[0], np.concatenate([X[200:], X[:100]]))


def test_streams_refuse_bad_input_naming_the_problem(files, tmp_path):
    X_path, y_path, X, y = files
    with pytest.raises(ValueError, match="y has 299 rows but X has 300"):
        ArrayStream(X, y[:299])
    with pytest.raises(TypeError, match="floating-point"):
        ArrayStream(X.astype(np.int32), y)
    with pytest.raises(FileNotFoundError, match="no file"):
        ArrayStream(tmp_path / "absent.npy", y_path)
    bad = X.copy()
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        ArrayStream(bad, y)
    class Rows(IterableDataset):
        def __iter__(self):
            return iter(())

    with pytest.raises(TypeError, match="IterableStream"):
        as_stream(Rows())
    with pytest.raises(ValueError, match="yields no items"):
        IterableStream(Rows(), num_data=3)
    with pytest.raises(ValueError, match="num_data"):
        IterableStream([(X[0], y[0])], num_data=0)
    with pytest.raises(IndexError, match=re.escape("[0, 300)")):
        ArrayStream(X, y).rows([300])
    np.save(tmp_path / "short.npy", X)
    with open(tmp_path / "short.npy", "r+b") as fh:
        fh.truncate(1000)
    with pytest.raises(ValueError, match="truncated"):
        ArrayStream(tmp_path / "short.npy", y)


# ------------------------------------------------------------------------- fit on a stream
def test_fit_on_a_stream_equals_fit_on_its_standardised_rows(files):
    X_path, y_path, _, _ = files
    stream = ArrayStream(X_path, y_path)
    X, y = stream.rows(np.arange(stream.num_data))
    runs = []
    for data in ((X, y), (stream,)):
        pyro.clear_param_store()
        model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8, seed=0)
        guide = dgp.guides.MeanField(model)
        runs.append(dgp.fit(model, guide, *data, num_steps=4, progress=False,
                            final_elbo_particles=0).losses)
    assert runs[0] == runs[1]  # full batch: the same rows in the same order, the same draws


def test_minibatches_of_a_stream_give_an_unbiased_data_sum(files):
    # (N / B) sum_{batch} y estimates sum_i y; with B rows drawn uniformly with replacement
    # its standard deviation is N sqrt(var(y) / B); the mean of K draws is within 4 standard
    # errors N sqrt(var(y) / (B K)) of the sum (a false alarm once in 15,000 runs)
    X_path, y_path, _, _ = files
    stream = ArrayStream(X_path, y_path)
    y_all = stream.rows(np.arange(300))[1]
    batches = Batches(stream, 10, dtype=torch.float64, device="cpu")
    generator = torch.Generator().manual_seed(0)
    K = 2000
    estimates = torch.stack([batches.draw(generator)[1].sum() * 300 / 10 for _ in range(K)])
    se = 300 * math.sqrt(float(y_all.var(unbiased=False)) / (10 * K))
    assert abs(float(estimates.mean() - y_all.sum())) < 4 * se


def test_elbo_over_chunks_counts_the_kl_once_for_any_chunking():
    # one layer: no draws, so the chunked sum must equal the ELBO on all rows to rounding;
    # a KL counted per chunk would be off by (chunks - 1) KL
    model, guide, X, y = worker.problem(1, "MeanField")
    guide(X[:4], y[:4])
    whole = evaluate_elbo(model, guide, X, y, 2).value
    for chunk_rows in (64, 10, 7):
        assert chunked_elbo(model, guide, (X, y), 2, chunk_rows=chunk_rows).value == \
            pytest.approx(whole, abs=1e-10)
    stream = ArrayStream(X.numpy(), y.numpy(), standardize=False)
    assert chunked_elbo(model, guide, stream, 1, chunk_rows=9).value == pytest.approx(
        whole, abs=1e-10)


def test_predictions_by_chunk_equal_one_prediction_and_report_in_original_units(files):
    X_path, y_path, X_raw, y_raw = files
    stream = ArrayStream(X_path, y_path)
    X, y = stream.rows(np.arange(300))
    model = dgp.DeepGP.regression(X, y, num_layers=1, num_inducing=8, seed=0)
    guide = dgp.guides.MeanField(model)
    dgp.fit(model, guide, X, y, num_steps=5, progress=False, final_elbo_particles=0)
    units = stream.standardization
    test = ArrayStream(X_raw[:50], y_raw[:50], standardization=units)
    # one layer, collapsed: every draw's Gaussian is the same, so chunking changes nothing
    whole = dgp.predict(model, guide, X[:50], 4, y_mean=units.y_mean, y_std=units.y_std)
    chunks = list(predict_chunks(model, guide, test, num_samples=4, chunk_rows=16))
    assert [len(t) for _, t in chunks] == [16, 16, 16, 2]
    torch.testing.assert_close(torch.cat([p.mean for p, _ in chunks]), whole.mean)
    y_orig = torch.from_numpy(y_raw[:50].astype(np.float64))
    torch.testing.assert_close(torch.cat([t for _, t in chunks]), y_orig)
    report = stream_report(model, guide, test, num_samples=4, chunk_rows=16)
    expected = dgp.metrics.regression_report(whole, y_orig)
    for name, value in expected.items():
        assert report[name] == pytest.approx(value, rel=1e-10, abs=1e-12), name
    tensor_chunks = list(predict_chunks(model, guide, X[:50], num_samples=4, chunk_rows=20))
    assert tensor_chunks[0][1] is None and len(tensor_chunks) == 3


def test_each_chunk_draws_from_its_own_seed():
    # two layers: the inner layer's draws make each prediction depend on its seed
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 2, generator=g, dtype=torch.float64)
    y = X.sin().sum(-1)
    model = dgp.DeepGP.regression(X, y, num_layers=2, num_inducing=8, seed=0)
    guide = dgp.guides.MeanField(model, inner_variance=1.0)
    dgp.fit(model, guide, X, y, num_steps=3, progress=False, final_elbo_particles=0)
    first, again = (list(predict_chunks(model, guide, X, num_samples=4, chunk_rows=20,
                                        seed=7)) for _ in range(2))
    for (a, _), (b, _) in zip(first, again, strict=True):
        assert torch.equal(a.loc, b.loc)  # reproducible
    for c, (pred, _) in enumerate(first):  # chunk c from (seed, c)
        own = dgp.predict(model, guide, X[20 * c:20 * (c + 1)], 4, chunk_rows=20,
                          seed=step_seed(7, c, 0))
        assert torch.equal(pred.loc, own.loc)
    other = dgp.predict(model, guide, X[20:40], 4, chunk_rows=20, seed=step_seed(7, 0, 0))
    assert not torch.equal(first[1][0].loc, other.loc)  # the seed matters


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="reads /proc (Linux)")
def test_an_epoch_over_a_file_keeps_the_process_resident_memory_flat(tmp_path):
    # a 28 MiB file read in random batches: the pages a plain memory map touches stay in the
    # process's resident set (RssFile), and a batch of rows at random places maps about the
    # whole file at once (each row's page, and the cached folio or fault-around with it); the
    # stream reads rows with pread and maps nothing, so neither its resident set nor its peak
    # grows
    def status_kib(field: str) -> int:
        return int(re.search(rf"{field}:\s+(\d+)", Path("/proc/self/status").read_text())[1])

    def reset_peak() -> None:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS

    n, d = 1 << 20, 7
    X = np.lib.format.open_memmap(tmp_path / "X.npy", "w+", np.float32, (n, d))
    X[:] = 1.0
    X.flush()
    del X
    np.save(tmp_path / "y.npy", np.zeros(n, np.float32))
    batches = np.random.default_rng(0).integers(0, n, size=(32, 4096))
    stream = ArrayStream(tmp_path / "X.npy", tmp_path / "y.npy")  # one pass: the moments
    before, rss = status_kib("RssFile"), status_kib("VmRSS")
    reset_peak()
    for index in batches:
        stream.rows(index)
    streamed = (status_kib("RssFile") - before, status_kib("VmHWM") - rss)
    plain = np.load(tmp_path / "X.npy", mmap_mode="r")
    before, rss = status_kib("RssFile"), status_kib("VmRSS")
    reset_peak()
    for index in batches:
        assert float(plain[index].sum()) == 4096 * d
    mapped = (status_kib("RssFile") - before, status_kib("VmHWM") - rss)
    assert min(mapped) > 20 * 1024, mapped  # the control: a plain map holds what it read
    assert max(streamed) < 12 * 1024, streamed


def test_fit_refuses_missing_targets_and_streams_of_the_wrong_width(files):
    X_path, y_path, _, _ = files
    model, guide, X, y = worker.problem(1, "MeanField")
    with pytest.raises(ValueError, match="y is required"):
        dgp.fit(model, guide, X, num_steps=1, progress=False)
    with pytest.raises(ValueError, match="3 columns, the model takes 2"):
        dgp.fit(model, guide, ArrayStream(X_path, y_path), num_steps=1, progress=False)
    with pytest.raises(ValueError, match="y must be None"):
        dgp.fit(model, guide, ArrayStream(X_path, y_path), y, num_steps=1, progress=False)
