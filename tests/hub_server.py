"""A small Hugging Face Hub on 127.0.0.1, serving model repositories from local folders.

No Hub-protocol server from PyPI serves local repositories offline correctly (the ``olah``
mirror 0.5.4 offline answers a ranged request with the whole file and ``200``, and asks the
internet for repository info), so the tests run this one. It answers what
``huggingface_hub`` asks of the Hub for reading models:

- ``GET /api/models/ORG/NAME[/revision/REV]``: repository info (id, commit ``sha``, files);
- ``GET /api/models/ORG/NAME/tree/REV[/PATH]?recursive=``: a folder's listing;
- ``POST /api/models/ORG/NAME/paths-info/REV`` (form ``paths=``): some paths' info;
- ``HEAD``/``GET /ORG/NAME/resolve/REV/PATH``: a file, with ``Range: bytes=a-b`` answered
  ``206`` and only those bytes; the headers ``hf_hub_download`` reads (``X-Repo-Commit``,
  ``ETag``, ``X-Linked-Etag``/``X-Linked-Size`` for LFS files).

Errors carry the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``). A repository published with ``token=`` answers 401 without that bearer
token, as a private one does. Given a `cdn` (another `HubServer`, so another origin), large
files are redirected there (``302``, with the ``X-Linked-*`` headers), as the Hub sends them
to its CDN; the CDN serves ``/cdn/SHA256`` with ``Range`` too. Every request is recorded (`requests`) and every body byte of
a file counted (`bytes_sent`), so tests can prove that a slice reads only its bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".npz", ".msgpack")


@dataclass
class Repo:
    """A published repository: commits by id (each a folder) and branches to commits."""

    commits: dict[str, Path] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    token: str | None = None


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    authorization: str | None


class HubServer:
    """The server; `url` is its endpoint (``HF_ENDPOINT``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repos: dict[str, Repo] = {}
        self.requests: list[Request] = []
        self.bytes_sent = 0
        self.honour_ranges = True  # False: answer 200 and the whole file, as olah 0.5.4 does
        self.cdn: HubServer | None = None  # another server: large files redirect there
        self.blobs: dict[str, Path] = {}  # as a CDN: files by sha256
        self.lock = threading.Lock()
        hub = self

        class Handler(_HubHandler):
            server_state = hub

        # port 0: the kernel picks a free port as it binds (no window for another process)
        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def publish(
        self, source: Path, repo_id: str, branch: str = "main", token: str | None = None
    ) -> str:
        """Commits a copy of `source` (a folder) as `branch` of `repo_id`; returns the commit."""
        digest = hashlib.sha1(repo_id.encode())
        for file in sorted(p for p in source.rglob("*") if p.is_file()):
            digest.update(str(file.relative_to(source)).encode() + b"\0" + file.read_bytes())
        commit = digest.hexdigest()
        with self.lock:
            repo = self.repos.setdefault(repo_id, Repo())
            repo.token = token
            target = self.root / repo_id / commit
            if not target.exists():
                shutil.copytree(source, target)
            repo.commits[commit] = target
            repo.refs[branch] = commit
        return commit

    def reset_counts(self) -> None:
        with self.lock:
            self.requests.clear()
            self.bytes_sent = 0

    def file_requests(self) -> list[Request]:
        """The requests for file contents (``/resolve/``), in order."""
        with self.lock:
            return [r for r in self.requests if "/resolve/" in r.path]


@contextlib.contextmanager
def hub_server(root: Path) -> Iterator[HubServer]:
    server = HubServer(root)
    server.thread.start()
    try:
        yield server
    finally:
        server.server.shutdown()
        server.server.server_close()
        server.thread.join(timeout=10)


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up
            super().handle_error(request, client_address)


_API = re.compile(
    r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/(?P<kind>revision|tree|paths-info)/(?P<rest>.*))?$"
)
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<path>.+)$")


class _HubHandler(http.server.BaseHTTPRequestHandler):
    server_state: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    # --- dispatch -----------------------------------------------------------------------
    def do_GET(self) -> None:
        self._dispatch(body=True)

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        form = parse_qs(self.rfile.read(length).decode()) if length else {}
        self._dispatch(body=True, form=form)

    def _dispatch(self, body: bool, form: dict | None = None) -> None:
        hub = self.server_state
        url = urlsplit(self.path)
        with hub.lock:
            hub.requests.append(
                Request(
                    self.command,
                    url.path,
                    self.headers.get("Range"),
                    self.headers.get("Authorization"),
                )
            )
        match = _API.match(url.path)
        if match:
            repo_id = unquote(match.group("repo"))
            kind, rest = match.group("kind"), match.group("rest") or ""
            if kind == "paths-info":
                self._paths_info(repo_id, unquote(rest), form or {})
                return
            if kind == "tree":
                revision, _, path = rest.partition("/")
                query = parse_qs(url.query)
                recursive = query.get("recursive", ["False"])[0].lower() == "true"
                self._tree(repo_id, unquote(revision), unquote(path), recursive)
                return
            self._info(repo_id, unquote(rest) if kind == "revision" else "main")
            return
        if url.path.startswith("/cdn/"):
            self._blob(url.path[len("/cdn/") :], body)
            return
        match = _RESOLVE.match(url.path)
        if match:
            self._resolve(
                unquote(match.group("repo")),
                unquote(match.group("revision")),
                unquote(match.group("path")),
                body,
            )
            return
        self._error(404, "", "Not a Hub route.")

    # --- routes -------------------------------------------------------------------------
    def _commit(self, repo_id: str, revision: str) -> tuple[str, Path] | None:
        """The commit and folder for `revision`; None after answering an error."""
        hub = self.server_state
        with hub.lock:
            repo = hub.repos.get(repo_id)
        expected = f"Bearer {repo.token}" if repo is not None and repo.token else None
        if repo is None or (expected and self.headers.get("Authorization") != expected):
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        commit = revision if revision in repo.commits else repo.refs.get(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            return None
        return commit, repo.commits[commit]

    def _info(self, repo_id: str, revision: str) -> None:
        found = self._commit(repo_id, revision)
        if found is None:
            return
        commit, folder = found
        files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        self._json(
            {
                "id": repo_id,
                "modelId": repo_id,
                "sha": commit,
                "private": False,
                "disabled": False,
                "siblings": [{"rfilename": name} for name in files],
            }
        )

    def _tree(self, repo_id: str, revision: str, path: str, recursive: bool) -> None:
        found = self._commit(repo_id, revision)
        if found is None:
            return
        _, folder = found
        start = folder / path if path else folder
        if not start.is_dir():
            self._error(404, "EntryNotFound", f"{path} does not exist on {revision}")
            return
        entries = sorted(start.rglob("*") if recursive else start.iterdir())
        self._json([_entry(folder, entry) for entry in entries])

    def _paths_info(self, repo_id: str, revision: str, form: dict) -> None:
        found = self._commit(repo_id, revision)
        if found is None:
            return
        _, folder = found
        paths = [p for p in form.get("paths", []) if (folder / p).exists()]
        self._json([_entry(folder, folder / p) for p in paths])

    def _resolve(self, repo_id: str, revision: str, path: str, body: bool) -> None:
        found = self._commit(repo_id, revision)
        if found is None:
            return
        commit, folder = found
        file = folder / path
        if ".." in Path(path).parts or not file.is_file():
            self._error(404, "EntryNotFound", f"{path} does not exist on {revision}")
            return
        entry = _entry(folder, file)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{entry["oid"]}"'}
        if "lfs" in entry:
            headers["X-Linked-Etag"] = f'"{entry["lfs"]["oid"]}"'
            headers["X-Linked-Size"] = str(entry["size"])
        cdn = self.server_state.cdn
        if cdn is not None and "lfs" in entry:  # as the Hub sends large files to its CDN
            with cdn.lock:
                cdn.blobs[entry["lfs"]["oid"]] = file
            self.send_response(302)
            self.send_header("Location", f"{cdn.url}/cdn/{entry['lfs']['oid']}?signed=1")
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send_file(file, body, headers)

    def _blob(self, sha: str, body: bool) -> None:
        with self.server_state.lock:
            file = self.server_state.blobs.get(sha)
        if file is None:
            self._error(404, "", "No such blob")
            return
        self._send_file(file, body, {})

    def _send_file(self, file: Path, body: bool, headers: dict[str, str]) -> None:
        size = file.stat().st_size
        begin, end = 0, size
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        status = 200
        if match and (match.group(1) or match.group(2)) and self.server_state.honour_ranges:
            if match.group(1):
                begin = int(match.group(1))
                end = min(size, int(match.group(2)) + 1) if match.group(2) else size
            else:
                begin = max(0, size - int(match.group(2)))
            if begin >= size:
                self._error(416, "", "Range not satisfiable")
                return
            status = 206
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", f"bytes {begin}-{end - 1}/{size}")
        self.send_header("Content-Length", str(end - begin))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if not body:
            return
        with open(file, "rb") as stream:
            stream.seek(begin)
            remaining = end - begin
            while remaining > 0:
                block = stream.read(min(remaining, 1 << 20))
                if not block:
                    break
                with self.server_state.lock:  # counted before the client can have it
                    self.server_state.bytes_sent += len(block)
                try:
                    self.wfile.write(block)
                except OSError:  # the client stopped reading
                    self.close_connection = True
                    return
                remaining -= len(block)

    # --- answers ------------------------------------------------------------------------
    def _json(self, value: object) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def _entry(folder: Path, entry: Path) -> dict:
    """The Hub's description of a file or folder of a commit."""
    path = str(entry.relative_to(folder))
    if entry.is_dir():
        oid = hashlib.sha1(path.encode()).hexdigest()
        return {"type": "directory", "oid": oid, "size": 0, "path": path}
    data = entry.read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    described: dict = {"type": "file", "oid": blob, "size": len(data), "path": path}
    if entry.name.endswith(LFS_SUFFIXES):
        described["lfs"] = {
            "oid": hashlib.sha256(data).hexdigest(),
            "size": len(data),
            "pointerSize": 134,
        }
    return described
