import os
import sys
import tempfile
from pathlib import Path

import pyro
import pytest
import torch

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


@pytest.fixture
def boston_data():
    """Skips the test unless UCI boston can be read (``PYRO_DGP_DATA``, as CI sets it)."""
    from pyro_dgp import datasets
    try:
        datasets.load("boston", split=0, download=False)
    except FileNotFoundError:
        pytest.skip("UCI data missing: set PYRO_DGP_DATA to the folder holding "
                    "uci/bostonHousing (e.g. ../shared/data)")


@pytest.fixture
def float64_local_params():
    """Parameters built in float64 (so a variance of 0.3 is 0.3, not its float32 rounding) and
    kept module-local (no aliasing of same-named parameters across likelihood instances)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    with pyro.settings.context(module_local_params=True):
        yield
    torch.set_default_dtype(old)
