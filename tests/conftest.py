import os
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("ELASTIC_RESET_DATA", ROOT.parent / "shared" / "data"))


@pytest.hookimpl(optionalhook=True)  # `pytest -p no:xdist`, or xdist not installed, runs serially
def pytest_xdist_auto_num_workers(config) -> int | None:
    """``-n auto`` (``make test``): one worker per CPU this process may run on (its affinity: a container's cpuset,
    a ``taskset``), not xdist's count of the host's physical cores: dozens of ~2 GB workers in a 2-CPU container.
    Where ``PYTEST_XDIST_AUTO_NUM_WORKERS`` is set, or there is no affinity (macOS), xdist decides (None)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS") or not hasattr(os, "sched_getaffinity"):
        return None
    return len(os.sched_getaffinity(0))


@pytest.fixture
def shared_data() -> Path:
    """The offline datasets (../shared/data). A user's clone has no ../shared: skip, saying why."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"offline datasets not found at {SHARED_DATA} (set ELASTIC_RESET_DATA to the data folder)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _seed_and_threads():
    """Seed, and one torch thread per test (restored after): the test models are tiny, and two threads on a
    2-core machine slow to a crawl (15x measured here) as soon as anything else uses a core."""
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def finished(tmp_path_factory) -> Path:
    """One uninterrupted run of ``helpers.run_config()``, trained once; each test damages its own copy (``run``)."""
    from elastic_reset.rl.trainer import RLTrainer
    from helpers import run_config

    run = tmp_path_factory.mktemp("finished") / "run"
    RLTrainer(run_config(), run).train()
    return run


@pytest.fixture
def run(finished, tmp_path) -> Path:
    """A copy of the ``finished`` run, for one test to damage."""
    copy = tmp_path / "run"
    shutil.copytree(finished, copy)
    return copy
