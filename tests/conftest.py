import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pyro
import pytest
import torch

# Imported first, from the directory pytest was started in: a relative $PYRO_DGP_DATA is read
# from there, whatever directory a test later changes to (pyro_dgp.datasets.env_data_dir).
import pyro_dgp.datasets  # noqa: F401

# The benchmark scripts (not part of the package) are imported by their tests from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
# ... and their results go to a temporary folder, never into the repository's
os.environ["PYRO_DGP_RESULTS_DIR"] = tempfile.mkdtemp(prefix="pyro_dgp_results_")

# The test problems are small: one thread avoids OpenMP spin-waiting on a 2-core CI machine
# (measured here: 8 ms per 20x20 tril with 2 threads under load, 1.5 us with one).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _fresh_pyro():
    """Each test starts from a clear param store, validation on, and a fixed seed."""
    pyro.clear_param_store()
    pyro.enable_validation(True)
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_download(monkeypatch):
    """The tests never download: a test that would is stopped by a dead ``urlopen`` (tests of
    the download itself serve the files from a patched one)."""
    def no_network(url, *args, **kwargs):
        raise urllib.error.URLError(f"the tests never download ({url}); set PYRO_DGP_DATA")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)


@pytest.fixture
def boston_data():
    """Skips the test unless UCI boston is found without a download (``PYRO_DGP_DATA``, as
    ``.ci/run`` sets it, or the user cache)."""
    from uci_data import uci_root_or_skip
    uci_root_or_skip("boston")


@pytest.fixture
def float64_local_params():
    """Parameters built in float64 (so a variance of 0.3 is 0.3, not its float32 rounding) and
    kept module-local (no aliasing of same-named parameters across likelihood instances)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    with pyro.settings.context(module_local_params=True):
        yield
    torch.set_default_dtype(old)
