"""Test set-up: 8 CPU devices so that sharding is tested without accelerators."""

import os

os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# JAX compiles the same small functions again and again: in test after test (each model built
# anew is traced anew), in the suite's workers, and in the processes the tests start (the
# command line, Tunix's workers, jax.distributed processes), which inherit these variables.
# One persistent compilation cache, in pytest's own cache folder, compiles each once across
# all of them and across runs (`make clean` empties it). Its entries are keyed by JAX's version
# and the compile's flags and devices, so each environment finds only its own. Setting
# JAX_COMPILATION_CACHE_DIR picks another folder; JAX_ENABLE_COMPILATION_CACHE=0 turns it off.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".pytest_cache", "jax"
    ),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# JAX writes an entry in place, so a process may read one that another is still writing; JAX
# then compiles anew and warns (pyproject.toml ignores the warning in this process). The
# processes the tests start ignore it too: it says nothing about suture, and a command's
# stderr is part of what the tests check.
os.environ["PYTHONWARNINGS"] = ",".join(
    filter(
        None,
        [
            os.environ.get("PYTHONWARNINGS", ""),
            "ignore:Error reading persistent compilation cache entry",
            "ignore:Error writing persistent compilation cache entry",
        ],
    )
)


import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# `make test` runs the suite on several pytest-xdist workers (`-n 2 --dist loadgroup`). Each
# worker is a process of its own, with its own temporary folders (tmp_path, tmp_path_factory),
# its own session fixtures (the servers below, each on a port the kernel picked for it) and its
# own environment variables, so a test is safe in parallel by default. Tests marked
# `@pytest.mark.xdist_group(NAME)` run on one worker, one after another (the other workers go
# on with the rest). The tests below share the group "serial", so that none of them runs beside
# another: a new test that starts several processes of its own or measures wall-clock seconds
# joins them here (a file, or a file::test).
SERIAL = "serial"
SERIAL_TESTS = {
    # 2 and 4 processes under jax.distributed, each with its own barrier timeouts
    "test_multihost.py",
    "test_examples.py::test_many_hosts_save_to_a_bucket",
    # how fast a process stops after a signal, in wall-clock seconds
    "test_hostile_signals.py",
    # a 2 s matching deadline, then the whole refusal within 15 s of wall clock
    "test_hostile_families.py::test_a_per_leaf_pattern_that_backtracks_is_stopped",
    "test_hostile_families.py::test_a_per_leaf_pattern_in_a_merge_config_is_stopped",
}


# The files whose tests take the longest (each a Tunix training run or a README in a fresh
# process, tens of seconds): with workers, they start first, so that none is left running alone
# at the end. (xdist hands out the groups first, the biggest first, then the other tests in
# the order collected.)
SLOW_FILES = ("test_tunix.py", "test_tunix_llama32.py", "test_readme.py", "test_reliability.py")


@pytest.hookimpl(trylast=True)  # after xdist's own hook, which reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if getattr(config.option, "loadgroup", False):
        items.sort(key=lambda item: item.path.name not in SLOW_FILES)  # stable: files stay whole
    for item in items:
        path, name = item.path.name, getattr(item, "originalname", item.name)
        if {path, f"{path}::{name}"} & SERIAL_TESTS and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(SERIAL))
        groups = sorted({str(mark.args[0]) for mark in item.iter_markers("xdist_group")})
        if getattr(config.option, "loadgroup", False) and groups and "@" not in item.nodeid:
            _rename(item, f"{item.nodeid}@{'_'.join(groups)}")


def _rename(item: pytest.Item, nodeid: str) -> None:
    """How xdist 3.8 tells its scheduler an item's group, for pytest 9.2, where a node's id is
    no longer the `_nodeid` string xdist sets (so the group was silently ignored)."""
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # the pytest xdist was written for: its own hook has done it
        item._nodeid = nodeid
    else:
        item._id = coerce_node_id(nodeid)


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 1 MiB tmpfs to fill up (skipped, with the reason, where mounting is not allowed)."""
    mount = tmp_path / "small"
    mount.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# Remote-storage servers (tests/remote_servers.py), one of each per test session: TensorStore
# reads the GCS endpoint from the environment once per process.
@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory):
    """A fake-gcs-server on 127.0.0.1; yields ``gs://BUCKET``."""
    from tests.remote_servers import BUCKET, gcs_server

    with gcs_server(tmp_path_factory.mktemp("gcs")):
        yield f"gs://{BUCKET}"


@pytest.fixture(scope="session")
def s3():
    """moto's S3 server on 127.0.0.1; yields ``s3://BUCKET``."""
    from tests.remote_servers import BUCKET, s3_server

    with s3_server():
        yield f"s3://{BUCKET}"


@pytest.fixture(scope="session")
def http(tmp_path_factory: pytest.TempPathFactory):
    """A range-request HTTP server of a temporary folder (a `RangeServer`)."""
    from tests.remote_servers import http_server

    with http_server(tmp_path_factory.mktemp("http")) as server:
        yield server
