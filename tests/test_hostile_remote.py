"""Hostile and broken servers: files replaced between requests, stalls, huge or compressed
metadata, credentials in URLs, and the S3 driver's credential-probe noise.

Real servers on 127.0.0.1 (`tests/remote_servers.py`): the HTTP range server (made hostile
per path with `Hostile`), moto's S3 server and fake-gcs-server. Every wait is bounded: the
stall tests set ``SUTURE_REMOTE_TIMEOUT`` to seconds and run the command line under a
timeout of their own.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import suture
from suture._location import MAX_METADATA_BYTES, location_of
from suture._redact import redact_text, redact_url
from tests.remote_servers import Hostile, upload


def cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """`suture ARGS` in a process of its own (the environment plus `env`)."""
    return subprocess.run(
        [sys.executable, "-m", "suture", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def two_tensors(path: Path, a: float, b: float) -> Path:
    """A safetensors file of 'a' and 'b' (same shapes: a swap keeps the header's length)."""
    save_file({"a": np.full(4, a, np.float32), "b": np.full(4, b, np.float32)}, str(path))
    return path


# --- item 4: a file that changes between requests ----------------------------------------


def test_http_file_replaced_after_open_is_an_error(http, tmp_path: Path) -> None:
    url = http.publish(two_tensors(tmp_path / "first.safetensors", 1, 2), "changing/m.safetensors")
    ckpt = suture.open(url)
    np.testing.assert_array_equal(ckpt["a"].read(), np.full(4, 1, np.float32))
    # the server's file is replaced (new inode: a new ETag) by one whose 'a' holds 'b's place
    swapped = two_tensors(tmp_path / "second.safetensors", 7, 8)
    os.replace(swapped, http.root / "changing/m.safetensors")
    with pytest.raises(suture.CorruptCheckpointError, match="changed since it was opened"):
        ckpt["a"].read()
    with pytest.raises(suture.CorruptCheckpointError, match=r"m\.safetensors.*ETag"):
        ckpt["b"].read()
    reopened = suture.open(url)  # opened again: the new file, read whole
    np.testing.assert_array_equal(reopened["a"].read(), np.full(4, 7, np.float32))


@pytest.mark.parametrize("compressed", [False, True])
def test_http_npz_replaced_after_open_is_an_error(http, tmp_path: Path, compressed: bool) -> None:
    save = np.savez_compressed if compressed else np.savez
    save(tmp_path / "first.npz", a=np.full(64, 1, np.float32), b=np.full(64, 2, np.float32))
    url = http.publish(tmp_path / "first.npz", f"changing/m{int(compressed)}.npz")
    ckpt = suture.open(url)
    np.testing.assert_array_equal(ckpt["a"].read(), np.full(64, 1, np.float32))
    save(tmp_path / "second.npz", a=np.full(64, 7, np.float32), b=np.full(64, 8, np.float32))
    os.replace(tmp_path / "second.npz", http.root / f"changing/m{int(compressed)}.npz")
    with pytest.raises(suture.CorruptCheckpointError, match="changed since it was opened"):
        ckpt["b"].read()


@pytest.mark.parametrize("store", ["gcs", "s3"])
def test_object_replaced_after_open_is_an_error(
    store: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    url = upload(
        two_tensors(tmp_path / "first.safetensors", 1, 2),
        f"{request.getfixturevalue(store)}/changing/m.safetensors",
    )
    ckpt = suture.open(url)
    np.testing.assert_array_equal(ckpt["b"].read(), np.full(4, 2, np.float32))
    upload(two_tensors(tmp_path / "second.safetensors", 7, 8), url)  # a new generation / ETag
    what = "generation" if store == "gcs" else "ETag"
    with pytest.raises(suture.CorruptCheckpointError, match=f"changed since it was opened.*{what}"):
        ckpt["a"].read()


def test_unchanged_object_rewritten_with_the_same_bytes_still_reads(s3: str, tmp_path: Path):
    """S3's ETag is the content's MD5: the same bytes written again are the same version."""
    file = two_tensors(tmp_path / "same.safetensors", 1, 2)
    url = upload(file, f"{s3}/same/m.safetensors")
    ckpt = suture.open(url)
    upload(file, url)
    np.testing.assert_array_equal(ckpt["a"].read(), np.full(4, 1, np.float32))


# --- item 9: every request has a deadline -------------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never reads or answers; yields its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    stop, held = threading.Event(), []

    def accept() -> None:
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:  # the 0.2 s accept timeout, or the listener closed
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in held:
            connection.close()
        listener.close()


def test_stalled_server_ends_in_an_error_within_the_deadline(silent_server: str) -> None:
    started = time.monotonic()
    result = cli("inspect", f"{silent_server}/model.safetensors", SUTURE_REMOTE_TIMEOUT="2")
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("Error: No answer from 'http://127.0.0.1:")
    assert "SUTURE_REMOTE_TIMEOUT" in result.stderr and "Traceback" not in result.stderr
    assert elapsed < 30, f"took {elapsed:.1f} s"


def test_server_stalling_mid_checkpoint_ends_in_an_error(
    http, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found on one request, stalled on the next: the library raises within the deadline."""
    url = http.publish(two_tensors(tmp_path / "m.safetensors", 1, 2), "stall/m.safetensors")
    ckpt = suture.open(url)
    monkeypatch.setenv("SUTURE_REMOTE_TIMEOUT", "1")
    http.hostile["/stall/m.safetensors"] = Hostile(stall=60)
    try:
        started = time.monotonic()
        with pytest.raises(suture.SurgeryError, match=r"No answer from .*within 1 s"):
            ckpt["a"].read()
        assert time.monotonic() - started < 10
    finally:
        del http.hostile["/stall/m.safetensors"]


@pytest.mark.parametrize("value", ["abc", "0", "-5", "nan", "inf"])
def test_remote_timeout_setting_must_be_a_positive_number(
    value: str, http, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = http.publish(
        two_tensors(tmp_path / "m.safetensors", 1, 2), f"setting/{value}.safetensors"
    )
    monkeypatch.setenv("SUTURE_REMOTE_TIMEOUT", value)
    with pytest.raises(suture.ArgumentError, match="SUTURE_REMOTE_TIMEOUT"):
        suture.open(url)


# --- item 10: metadata reads have size caps ----------------------------------------------


def test_huge_metadata_over_http_is_refused_without_reading_it(http) -> None:
    """A 2.5 GiB _METADATA (made as it is sent, never stored) is refused after one byte."""
    http.hostile["/huge/_METADATA"] = Hostile(size=5 << 29)
    before = http.bytes_sent
    try:
        with pytest.raises(suture.CorruptCheckpointError, match="holds more than 268,435,456"):
            suture.open(f"{http.url}/huge")
    finally:
        del http.hostile["/huge/_METADATA"]
    assert http.bytes_sent - before < 1 << 20


def test_gzip_index_inflating_past_the_cap_is_refused(http, tmp_path: Path) -> None:
    """An index.json sent with Content-Encoding: gzip, 300 MiB once inflated: refused."""
    padding = MAX_METADATA_BYTES + (44 << 20)
    body = gzip.compress(b'{"weight_map": {}, "pad": "' + b" " * padding + b'"}', 1)
    assert len(body) < 2 << 20  # about 1.3 MB sent
    http.hostile["/bomb/model.safetensors.index.json"] = Hostile(body=body, encoding="gzip")
    try:
        with pytest.raises(suture.CorruptCheckpointError, match="more than 268,435,456 bytes"):
            suture.open(f"{http.url}/bomb/model.safetensors.index.json")
    finally:
        del http.hostile["/bomb/model.safetensors.index.json"]


def test_small_gzip_index_is_read(http, tmp_path: Path) -> None:
    """The cap is on what the file decodes to: a compressed index under it reads as usual."""
    http.publish(two_tensors(tmp_path / "m.safetensors", 1, 2), "small/m.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "m.safetensors", "b": "m.safetensors"}}
    http.hostile["/small/model.safetensors.index.json"] = Hostile(
        body=gzip.compress(json.dumps(index).encode()), encoding="gzip"
    )
    try:
        ckpt = suture.open(f"{http.url}/small/model.safetensors.index.json")
        np.testing.assert_array_equal(ckpt["b"].read(), np.full(4, 2, np.float32))
    finally:
        del http.hostile["/small/model.safetensors.index.json"]


def gzip_bomb(prefix: bytes, mebibytes: int, suffix: bytes) -> bytes:
    """A gzip stream of `prefix`, `mebibytes` MiB of spaces and `suffix`, made in a blink:
    one MiB compressed once, its bytes repeated (a full flush between them makes each the
    same), and the trailer's CRC computed piece by piece. About 1 KiB per MiB inflated."""
    import struct
    import zlib

    block = b" " * (1 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    start = deflate.compress(prefix) + deflate.flush(zlib.Z_FULL_FLUSH)
    repeated = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
    end = deflate.compress(suffix) + deflate.flush()
    crc = zlib.crc32(prefix)
    for _ in range(mebibytes):
        crc = zlib.crc32(block, crc)
    size = len(prefix) + (mebibytes << 20) + len(suffix)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = struct.pack("<II", zlib.crc32(suffix, crc), size & 0xFFFFFFFF)
    return header + start + repeated * mebibytes + end + trailer


# `suture ARGS` with the metadata cap set to sys.argv[1] bytes (a bomb then stays small
# here); then the process's resident memory before the command and at its peak (KiB)
CAPPED = (
    "import re, sys\n"
    "import suture.sources.safetensors as source\n"
    "from suture.cli.app import main\n"
    "def kib(field):\n"
    "    return int(re.search(field + r':\\s*(\\d+)', open('/proc/self/status').read())[1])\n"
    "source.MAX_METADATA_BYTES = int(sys.argv[1])\n"
    "before = kib('VmRSS')\n"
    "try:\n"
    "    main(sys.argv[2:])\n"
    "finally:\n"
    "    print(before, kib('VmHWM'), file=sys.stderr)\n"
)


def test_gzip_bomb_index_stops_inflating_at_the_cap(http) -> None:
    """Half a megabyte of gzip that inflates to 512 MiB, under a cap of 8 MiB: refused
    naming the file and the cap, and the process grows by little more than the cap (it
    held the whole inflated body, twice, before: 3.1 GiB for a bigger bomb)."""
    body = gzip_bomb(b'{"weight_map": {}, "pad": "', 512, b'"}')
    assert len(body) < 1 << 20
    url = f"{http.url}/bomb-cli/model.safetensors.index.json"
    http.hostile["/bomb-cli/model.safetensors.index.json"] = Hostile(body=body, encoding="gzip")
    try:
        result = subprocess.run(
            [sys.executable, "-c", CAPPED, str(8 << 20), "inspect", url],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        del http.hostile["/bomb-cli/model.safetensors.index.json"]
    *message, memory = result.stderr.strip().splitlines()
    before, peak = map(int, memory.split())
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "holds more than 8,388,608 bytes (decoded)" in message[0]
    assert "bomb-cli/model.safetensors.index.json" in message[0]
    assert peak - before < 256 << 10, f"grew by {peak - before} KiB"


def test_gzip_bomb_config_under_a_recipe_is_one_error(http, tmp_path: Path) -> None:
    """A config.json served gzip-compressed that inflates past the metadata cap: the
    conversion's reads of it (whole, then its head) are refused naming the file and the
    cap, the remembered refusal raised as it is (it was taken for a read's answer: an
    AttributeError traceback, exit 1); nothing is written."""
    folder = f"bomb-config-{tmp_path.name}"
    http.publish(two_tensors(tmp_path / "model.safetensors", 1, 2), f"{folder}/model.safetensors")
    path = f"/{folder}/config.json"
    mebibytes = (MAX_METADATA_BYTES >> 20) + 8
    http.hostile[path] = Hostile(body=gzip_bomb(b'{"pad": "', mebibytes, b'"}'), encoding="gzip")
    url, out = f"{http.url}/{folder}/", tmp_path / "out"
    try:
        with pytest.raises(suture.SurgeryError, match=r"config\.json.* more than 268,435,456"):
            suture.convert(url, out, recipe="llama3.1:maxtext")
        result = cli("convert", url, str(out), "--recipe", "llama3.1:maxtext")
    finally:
        del http.hostile[path]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert f"{folder}/config.json" in errors[0] and "268,435,456 bytes" in errors[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "deflate-raw", "gzip, gzip"])
def test_compressed_metadata_in_each_encoding_reads(http, tmp_path: Path, encoding: str) -> None:
    """Each encoding suture asks for decodes to the same index (deflate with or without its
    zlib header, as servers send it; encodings applied twice, undone in reverse)."""
    import zlib

    http.publish(
        two_tensors(tmp_path / "m.safetensors", 1, 2), f"enc/{tmp_path.name}/m.safetensors"
    )
    raw = json.dumps({"weight_map": {"a": "m.safetensors", "b": "m.safetensors"}}).encode()
    body = {
        "gzip": gzip.compress(raw),
        "deflate": zlib.compress(raw),
        "deflate-raw": zlib.compress(raw, wbits=-zlib.MAX_WBITS),
        "gzip, gzip": gzip.compress(gzip.compress(raw)),
    }[encoding]
    path = f"/enc/{tmp_path.name}/model.safetensors.index.json"
    http.hostile[path] = Hostile(body=body, encoding=encoding.replace("-raw", ""))
    try:
        ckpt = suture.open(f"{http.url}{path}")
        np.testing.assert_array_equal(ckpt["b"].read(), np.full(4, 2, np.float32))
    finally:
        del http.hostile[path]


def test_metadata_in_an_encoding_suture_does_not_decode_is_refused(http) -> None:
    http.hostile["/br/model.safetensors.index.json"] = Hostile(
        body=b"\x0b\x02\x80{}\x03", encoding="br"
    )
    try:
        with pytest.raises(
            suture.CorruptCheckpointError, match=r"'Content-Encoding: br'.*does not"
        ):
            suture.open(f"{http.url}/br/model.safetensors.index.json")
    finally:
        del http.hostile["/br/model.safetensors.index.json"]


# `suture ARGS`, then the process's peak resident memory (KiB) as the last line of stderr:
# VmHWM, which starts again at exec (getrusage's maxrss keeps the forked parent's)
MEASURED = (
    "import re, sys\n"
    "from suture.cli.app import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "finally:\n"
    "    status = open('/proc/self/status').read()\n"
    "    print(re.search(r'VmHWM:\\s*(\\d+)', status)[1], file=sys.stderr)\n"
)


def test_huge_metadata_in_a_real_process_exits_2_in_bounded_memory(http) -> None:
    http.hostile["/huge-cli/_METADATA"] = Hostile(size=5 << 29)
    try:
        result = subprocess.run(
            [sys.executable, "-c", MEASURED, "inspect", f"{http.url}/huge-cli"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        del http.hostile["/huge-cli/_METADATA"]
    *message, peak_kib = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "holds more than" in message[0]
    assert int(peak_kib) < 512 << 10, f"peaked at {peak_kib} KiB"  # it was 2.6 GiB


def test_local_metadata_is_capped_too(tmp_path: Path) -> None:
    file = tmp_path / "big.json"
    file.write_bytes(b" " * 1025)
    with pytest.raises(suture.CorruptCheckpointError, match="holds more than 1,024 bytes"):
        location_of(file).read_bytes(1024)
    assert location_of(file).read_bytes(1025) == b" " * 1025


# --- item 7: credentials in URLs are never echoed ---------------------------------------

SECRET = "PW-s3cr3t"


def test_credentials_in_a_url_are_not_printed(http) -> None:
    host = http.url.removeprefix("http://")
    for url in (
        f"http://alice:{SECRET}@{host}/missing.safetensors",
        f"http://{host}/missing.safetensors?X-Amz-Signature={SECRET}&token={SECRET}",
        f"http://{SECRET}@{host}/forbidden/x.safetensors",
    ):
        result = cli("inspect", url)
        assert result.returncode == 2, result.stderr
        assert SECRET not in result.stdout + result.stderr
        assert "***" in result.stderr and host in result.stderr  # still says which server


def test_credentials_in_a_url_are_not_in_errors_or_the_checkpoint(http, tmp_path: Path) -> None:
    published = http.publish(two_tensors(tmp_path / "m.safetensors", 1, 2), "creds/m.safetensors")
    url = published.replace("http://", f"http://bob:{SECRET}@")
    ckpt = suture.open(url)  # the test server ignores the credentials; the driver sends them
    assert SECRET not in ckpt.location and SECRET not in repr(ckpt)
    with pytest.raises(suture.MissingLeafError) as missing:
        ckpt["nope"]
    assert SECRET not in str(missing.value)
    with pytest.raises(suture.SurgeryError) as absent:
        suture.open(url.replace("m.safetensors", "absent.safetensors"))
    assert SECRET not in str(absent.value) and "bob" not in str(absent.value)
    out = tmp_path / "out"
    result = cli("convert", url, str(out))
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout + result.stderr
    for file in out.rglob("*"):
        if file.is_file():
            assert SECRET.encode() not in file.read_bytes(), file


def test_redaction_keeps_what_names_the_file() -> None:
    assert redact_url("s3://bucket/key/model.safetensors") == "s3://bucket/key/model.safetensors"
    assert (
        redact_url("https://u:p@example.com:8443/a/b.json?X-Amz-Signature=abc&v=2#part")
        == "https://***@example.com:8443/a/b.json?X-Amz-Signature=***&v=***#part"
    )
    assert redact_text("no url here: a=b?c=d") == "no url here: a=b?c=d"
    assert redact_text("'gs://b/x?token=t', \"http://a:b@h/\"") == (
        "'gs://b/x?token=***', \"http://***@h/\""
    )


def test_every_surgery_error_redacts_urls() -> None:
    error = suture.DestinationError(f"Cannot write 'https://x:{SECRET}@h/o?sig={SECRET}'")
    assert SECRET not in str(error) and SECRET not in repr(error.args)


# --- item 16: no credential-probe noise on s3:// commands -------------------------------


def test_s3_commands_print_no_credential_provider_lines(s3: str, tmp_path: Path) -> None:
    url = upload(two_tensors(tmp_path / "m.safetensors", 1, 2), f"{s3}/quiet/m.safetensors")
    home = tmp_path / "home"  # no ~/.aws/config, no ~/.aws/credentials
    home.mkdir()
    result = cli("inspect", url, HOME=str(home))
    assert result.returncode == 0, result.stderr
    assert "AuthCredentialsProvider" not in result.stderr
    assert ".aws" not in result.stderr and result.stderr == ""


def test_the_credential_chain_is_quiet_unless_debug(s3: str, tmp_path: Path) -> None:
    """No keys in the environment: the driver's default chain runs (and finds nothing here)."""
    url = upload(two_tensors(tmp_path / "m.safetensors", 1, 2), f"{s3}/quiet/chain.safetensors")
    home = tmp_path / "home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    }
    env["HOME"] = str(home)

    def run(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "suture", *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)

    quiet = run("inspect", url)
    assert quiet.returncode == 2 and quiet.stderr.startswith("Error: Cannot access 's3://")
    assert "AuthCredentialsProvider" not in quiet.stderr and "config profile" not in quiet.stderr
    assert len(quiet.stderr.splitlines()) == 1
    assert "No AWS credentials were found (AWS_ACCESS_KEY_ID is not set" in quiet.stderr
    debug = run("--debug", "inspect", url)
    assert "AuthCredentialsProvider" in debug.stderr  # --debug shows what the chain tried
