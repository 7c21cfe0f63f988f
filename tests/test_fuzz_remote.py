"""Hostile HTTP servers, generated: every read ends in a SurgeryError or in values of one
version of the file, within a bounded time; never a crash, a hang or a mix of versions.

Hypothesis draws what the server does to one file of a checkpoint (a safetensors file, an
index.json and its shard) from some request on: stalls, a replacement file (a new ETag),
a gzip-encoded body, a huge body made as it is sent, ranges ignored, connections cut. Runs
on the real HTTP range server of `tests/remote_servers.py` on 127.0.0.1. `make test` runs
a few cases; `make fuzz` runs ``SUTURE_FUZZ_EXAMPLES`` (1,000) per generator and, with
``SUTURE_FUZZ_REPORT`` set, writes the counts of outcomes by kind to that file.
"""

from __future__ import annotations

import gzip
import itertools
import json
import os
import struct
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import suture
from suture._location.remote import forget_stores
from suture.sources import safetensors as safetensors_source
from tests.remote_servers import Hostile, RangeServer, http_server

EXAMPLES = int(os.environ.get("SUTURE_FUZZ_EXAMPLES", "15"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # each example checks its own time bound
    suppress_health_check=list(HealthCheck),
    derandomize=EXAMPLES <= 100,
)
TIMEOUT = 0.5  # SUTURE_REMOTE_TIMEOUT for these tests: a stall costs half a second
BOUND = 30.0  # seconds any one example may take, stalls and retries included
METADATA_CAP = 64 << 10  # the metadata cap, lowered so that bombs stay small here
OUTCOMES: dict[str, Counter] = {}
_names = itertools.count()

ROWS = 256
A = np.arange(ROWS, dtype=np.float32)
B = -1 - np.arange(ROWS, dtype=np.float32)


def safetensors_bytes(first: np.ndarray, second: np.ndarray) -> bytes:
    """A file of 'a' then 'b' (fixed layout): swapping the data swaps the values, so that a
    header of one version read with the data of the other gives 'a' the values of 'b'."""
    header = {
        "a": {"dtype": "F32", "shape": [ROWS], "data_offsets": [0, 4 * ROWS]},
        "b": {"dtype": "F32", "shape": [ROWS], "data_offsets": [4 * ROWS, 8 * ROWS]},
    }
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + first.tobytes() + second.tobytes()


FIRST = safetensors_bytes(A, B)  # the file as published
SECOND = safetensors_bytes(B, A)  # the file that replaces it: same header, data swapped
VERSIONS = {"first": {"a": A, "b": B}, "second": {"a": B, "b": A}}


@pytest.fixture(scope="module")
def server() -> Iterator[RangeServer]:
    """A server of this module's own (stalled requests do not hold up other tests)."""
    saved = {name: os.environ.get(name) for name in ("SUTURE_REMOTE_TIMEOUT",)}
    os.environ["SUTURE_REMOTE_TIMEOUT"] = str(TIMEOUT)
    cap = safetensors_source.MAX_METADATA_BYTES
    safetensors_source.MAX_METADATA_BYTES = METADATA_CAP
    with tempfile.TemporaryDirectory() as root, http_server(Path(root)) as running:
        try:
            yield running
        finally:
            safetensors_source.MAX_METADATA_BYTES = cap
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    yield
    target = os.environ.get("SUTURE_FUZZ_REPORT")
    if target:
        Path(target).write_text(
            json.dumps({kind: dict(counts) for kind, counts in OUTCOMES.items()}, indent=1)
        )


def misbehaviour(body_for_change: bytes) -> st.SearchStrategy[Hostile]:
    """What the server does from some request on (and for some requests only)."""
    when = st.tuples(st.integers(0, 6), st.one_of(st.none(), st.integers(1, 4)))

    def timed(kind: st.SearchStrategy[dict]) -> st.SearchStrategy[Hostile]:
        return st.builds(
            lambda moment, fields: Hostile(
                after=moment[0],
                until=None if moment[1] is None else moment[0] + moment[1],
                **fields,
            ),
            when,
            kind,
        )

    kinds = st.one_of(
        st.floats(0.05, 1.5).map(lambda seconds: {"stall": seconds}),
        st.just({"body": body_for_change}),  # the file replaced: a new ETag
        st.just({"body": gzip.compress(body_for_change), "encoding": "gzip"}),
        st.sampled_from(["gzip", "deflate", "br", "x-unknown"]).map(
            lambda name: {"encoding": name}  # a header that lies about the body
        ),
        st.integers(1, 1 << 40).map(lambda size: {"size": size}),  # huge, made as sent
        st.just({"ignore_range": True}),
        st.integers(0, len(FIRST)).map(lambda count: {"cut": count}),
    )
    return timed(kinds)


def outcome_of(kind: str, read) -> None:  # noqa: ANN001 (a function reading the checkpoint)
    """Runs `read`; records the outcome; fails on anything but a SurgeryError or one version.

    Each case starts with a fresh pool of request slots: requests earlier cases gave up on
    go on retrying against their hostile paths for a while, and would hold slots.
    """
    forget_stores()
    started = time.monotonic()
    try:
        values = read()
        found = [
            name
            for name, version in VERSIONS.items()
            if all(np.array_equal(values[key], expected) for key, expected in version.items())
        ]
        assert found, f"{kind}: values of no single version: {values}"
        outcome = f"read ({found[0]} version)"
    except suture.SurgeryError as error:
        outcome = type(error).__name__
        text = str(error)
        if "changed since it was opened" in text:
            outcome += " (changed)"
        elif "No answer from" in text:
            outcome += " (deadline)"
        elif "holds more than" in text:
            outcome += " (size cap)"
    elapsed = time.monotonic() - started
    assert elapsed < BOUND, f"{kind}: {outcome} after {elapsed:.1f} s"
    OUTCOMES.setdefault(kind, Counter())[outcome] += 1


def read_all(url: str) -> dict[str, np.ndarray]:
    ckpt = suture.open(url)
    return {name: leaf.read() for name, leaf in ckpt.arrays().items()}


@FUZZ
@given(hostile=misbehaviour(SECOND))
def test_fuzz_hostile_http_single_file(server: RangeServer, hostile: Hostile) -> None:
    path = f"single/{next(_names)}/model.safetensors"
    (server.root / path).parent.mkdir(parents=True)
    (server.root / path).write_bytes(FIRST)
    server.hostile[f"/{path}"] = hostile
    try:
        outcome_of("safetensors file", lambda: read_all(f"{server.url}/{path}"))
    finally:
        del server.hostile[f"/{path}"]


INDEX = json.dumps(
    {"metadata": {}, "weight_map": {"a": "shard.safetensors", "b": "shard.safetensors"}}
)


@FUZZ
@given(
    target=st.sampled_from(["index", "shard"]),
    hostile=misbehaviour(SECOND),
    index_hostile=st.one_of(
        # an index that inflates or streams past the metadata cap, or stays just under it
        st.integers(METADATA_CAP - 2048, 4 * METADATA_CAP).map(
            lambda size: Hostile(
                body=gzip.compress(INDEX[:-1].encode() + b', "pad": "' + b" " * size + b'"}'),
                encoding="gzip",
            )
        ),
        st.integers(METADATA_CAP - 64, 1 << 40).map(
            lambda size: Hostile(size=size, fill=lambda offset, count: b" " * count)
        ),
    ),
    use_index_body=st.booleans(),
)
def test_fuzz_hostile_http_index_and_shard(
    server: RangeServer, target: str, hostile: Hostile, index_hostile: Hostile, use_index_body
) -> None:
    folder = f"sharded/{next(_names)}"
    (server.root / folder).mkdir(parents=True)
    (server.root / folder / "model.safetensors.index.json").write_text(INDEX)
    (server.root / folder / "shard.safetensors").write_bytes(FIRST)
    name = "model.safetensors.index.json" if target == "index" else "shard.safetensors"
    if target == "index":
        if use_index_body:
            hostile = index_hostile
        elif hostile.body is not None and hostile.encoding is None:
            hostile.body = INDEX.replace("shard", "other").encode()  # points at a missing shard
        elif hostile.body is not None:
            hostile.body = gzip.compress(INDEX.encode())
    server.hostile[f"/{folder}/{name}"] = hostile
    try:
        outcome_of(
            f"{target} of a sharded checkpoint",
            lambda: read_all(f"{server.url}/{folder}/model.safetensors.index.json"),
        )
    finally:
        del server.hostile[f"/{folder}/{name}"]
