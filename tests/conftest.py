"""Test set-up: 8 CPU devices so that sharding is tested without accelerators."""

import os

os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")


import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402


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
