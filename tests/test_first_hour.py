"""A newcomer's first hour, round three (issue 41): offline remotes that fail at once, no
native log lines, the Hub cache offline, and the wording of errors and summaries.

Remote tests use a reserved ``.invalid`` name (which never resolves) and closed ports on
127.0.0.1 only; no real address is contacted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._location.remote import forget_stores
from tests.remote_servers import free_port

RETRY_NOTE = (
    "suture gives up at once on this, without retrying; transient failures (a timeout, a "
    "dropped connection, a 5xx answer) are retried SUTURE_REMOTE_RETRIES times (now 10) "
    "within SUTURE_REMOTE_TIMEOUT seconds (now 120)."
)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "suture", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def _fails_at_once(url: str, **env: str) -> str:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    forget_stores()
    start = time.monotonic()
    try:
        with pytest.raises(suture.SurgeryError) as failed:
            suture.open(url)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        forget_stores()
    assert time.monotonic() - start < 5
    return str(failed.value)


# --- item 1: permanent failures are not retried ----------------------------------------


@pytest.mark.parametrize(
    ("url", "env", "shown"),
    [
        ("https://nowhere.invalid/model", {}, "https://nowhere.invalid"),
        (
            "gs://bucket/model",
            {"TENSORSTORE_GCS_HTTP_URL": "http://nowhere.invalid"},
            "gs://bucket",
        ),
        (
            "s3://bucket/model",
            {"AWS_ENDPOINT_URL_S3": "http://nowhere.invalid:9000"},
            "s3://bucket",
        ),
    ],
)
def test_a_host_name_that_does_not_resolve_fails_at_once(url, env, shown) -> None:
    message = _fails_at_once(url, **env)
    assert message == (
        f"Cannot reach {shown}: the host name 'nowhere.invalid' does not resolve "
        f"({message.split('(')[1].split(')')[0]}): offline, or a typo in the name. {RETRY_NOTE}"
    )


@pytest.mark.parametrize("scheme", ["http", "gs", "s3"])
def test_a_refused_connection_fails_at_once(scheme: str) -> None:
    port = free_port()  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    url = {"http": f"{endpoint}/model", "gs": "gs://bucket/m", "s3": "s3://bucket/m"}[scheme]
    env = {"gs": {"TENSORSTORE_GCS_HTTP_URL": endpoint}, "s3": {"AWS_ENDPOINT_URL_S3": endpoint}}
    message = _fails_at_once(url, **env.get(scheme, {}))
    shown = {"http": endpoint, "gs": "gs://bucket", "s3": "s3://bucket"}[scheme]
    assert message == (
        f"Cannot reach {shown}: 127.0.0.1:{port} refused the connection (Connection refused): "
        f"no server listens there, or the network is down. Check the address and that the "
        f"server runs. {RETRY_NOTE}"
    )


def test_the_retry_setting_is_named_and_checked(monkeypatch) -> None:
    monkeypatch.setenv("SUTURE_REMOTE_RETRIES", "3")
    message = _fails_at_once("https://nowhere.invalid/m")
    assert "retried SUTURE_REMOTE_RETRIES times (now 3)" in message
    monkeypatch.setenv("SUTURE_REMOTE_RETRIES", "many")
    with pytest.raises(suture.SurgeryError, match="SUTURE_REMOTE_RETRIES='many' is not a number"):
        suture.open("https://nowhere.invalid/m")


def test_the_command_line_fails_at_once_offline() -> None:
    start = time.monotonic()
    result = cli("inspect", "https://nowhere.invalid/model")
    assert time.monotonic() - start < 15  # the interpreter's start included
    assert result.returncode == 2
    assert result.stderr.startswith(
        "Error: Cannot reach https://nowhere.invalid: the host name 'nowhere.invalid' does not"
    )


# --- item 2: no native log line; a scheme's own credentials hint -----------------------


def test_gs_without_credentials_prints_no_native_line_and_says_what_is_missing(
    gcs: str, tmp_path: Path
) -> None:
    home = tmp_path / "home"  # no gcloud credentials file
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "GOOGLE_AUTH_TOKEN_FOR_TESTING"}
    env.update(HOME=str(home), GCE_METADATA_HOST="nowhere.invalid")
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    command = [sys.executable, "-m", "suture", "inspect", f"{gcs}/absent/m.safetensors"]
    quiet = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert quiet.returncode != 0
    assert "google_auth_provider" not in quiet.stderr, quiet.stderr
    assert quiet.stderr.startswith("Error: ")
    debug = subprocess.run(
        [sys.executable, "-m", "suture", "--debug", *command[3:]],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert "google_auth_provider" in debug.stderr  # --debug shows what the driver logged


def test_access_errors_name_each_schemes_credentials(monkeypatch, tmp_path: Path) -> None:
    from suture._location.credentials import credentials_hint

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in (
        "GOOGLE_AUTH_TOKEN_FOR_TESTING",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "CLOUDSDK_CONFIG",
        "AWS_ACCESS_KEY_ID",
        "AWS_PROFILE",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_CONFIG_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    gcloud = tmp_path / ".config/gcloud/application_default_credentials.json"
    assert credentials_hint("gs") == (
        f"No GCS credentials were found (GOOGLE_APPLICATION_CREDENTIALS is not set, and there "
        f"is no {gcloud}), so the request went without them, which reads public buckets only. "
        f"Check the path; for a private bucket run `gcloud auth application-default login`, "
        f"set GOOGLE_APPLICATION_CREDENTIALS to a service account's key file, or run on a "
        f"Google Cloud machine (its metadata server)."
    )
    assert credentials_hint("s3").startswith("No AWS credentials were found")
    assert credentials_hint("https") == "Check the URL, and that the server serves it."
    assert "credential" not in credentials_hint("http")
    gcloud.parent.mkdir(parents=True)
    gcloud.write_text("{}")
    assert credentials_hint("gs") == (
        f"Check the path, and that the GCS credentials in use ({gcloud}) may read it."
    )


def test_an_http_error_says_nothing_of_credentials(http, tmp_path: Path) -> None:
    save_file({"a": np.ones(2, np.float32)}, str(tmp_path / "m.safetensors"))
    url = http.publish(tmp_path / "m.safetensors", "creds3/m.safetensors")
    with pytest.raises(suture.SurgeryError) as failed:
        suture.open(url.replace("m.safetensors", "absent.safetensors"))
    assert "credential" not in str(failed.value)
