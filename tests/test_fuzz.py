"""Hostile inputs: every mutated file ends in a SurgeryError or a correct read, never a crash.

Each reader gets hypothesis-made inputs: mutated safetensors headers (sizes, offsets, shapes,
dtypes, names, lengths past the end), mutated Orbax ``_METADATA`` and data files, mutated
Flax msgpack bytes, mutated npz archives. `make test` runs a fast subset; `make fuzz` runs
``SUTURE_FUZZ_EXAMPLES`` (10,000) cases per reader and, with ``SUTURE_FUZZ_REPORT`` set,
writes the counts of outcomes by kind to that file.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import struct
import tempfile
import tracemalloc
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import suture

EXAMPLES = int(os.environ.get("SUTURE_FUZZ_EXAMPLES", "100"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=5000,
    suppress_health_check=list(HealthCheck),
    derandomize=EXAMPLES <= 100,
)
OUTCOMES: dict[str, Counter] = {}


def attempt(reader: str, path: Path, size: int, **open_options) -> None:
    """Opens and reads everything; records the outcome; fails on any non-SurgeryError."""
    tracemalloc.start()
    try:
        ckpt = suture.open(path, **open_options)
        for leaf in ckpt.arrays().values():
            leaf.read()
        outcome = "read"
    except suture.SurgeryError as error:
        outcome = type(error).__name__
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    OUTCOMES.setdefault(reader, Counter())[outcome] += 1
    assert peak < 64 * 2**20 + 16 * size, (
        f"{reader}: {peak} bytes allocated for a {size}-byte input"
    )


@pytest.fixture(scope="module", autouse=True)
def report():
    yield
    target = os.environ.get("SUTURE_FUZZ_REPORT")
    if target:
        Path(target).write_text(
            json.dumps({reader: dict(counts) for reader, counts in OUTCOMES.items()}, indent=1)
        )


def _workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="suture-fuzz-"))


# safetensors ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


def _valid_safetensors_header() -> dict:
    return {
        "__metadata__": {"format": "np"},
        "a.weight": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "a.bias": {"dtype": "BF16", "shape": [3], "data_offsets": [24, 30]},
        "b": {"dtype": "I8", "shape": [], "data_offsets": [30, 31]},
    }


@st.composite
def safetensors_files(draw) -> bytes:
    header = _valid_safetensors_header()
    data = bytes(range(31))
    kind = draw(
        st.sampled_from(["entry", "entry", "random_header", "length", "truncate", "names", "bytes"])
    )
    if kind == "entry":
        name = draw(st.sampled_from(["a.weight", "a.bias", "b", "__metadata__"]))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "whole"]))
        value = draw(
            st.one_of(
                json_values,
                st.sampled_from(["F32", "F64", "F8_E4M3", "BOOL", "F99", "", "I4"]),
                st.lists(st.integers(-5, 2**62), max_size=4),
            )
        )
        if field == "whole" or not isinstance(header[name], dict):
            header[name] = value
        else:
            header[name][field] = value
    elif kind == "random_header":
        header = draw(json_values)
    elif kind == "names":
        name = draw(
            st.sampled_from(["/", "..", "", "a/../b", "x" * 300, "a..b", ".", "a.weight.extra"])
        )
        header[name] = header.pop("b")
    raw = json.dumps(header).encode()
    length = len(raw)
    if kind == "length":
        length = draw(st.integers(0, 2**64 - 1))
    blob = struct.pack("<Q", length) + raw + data
    if kind == "truncate":
        blob = blob[: draw(st.integers(0, len(blob)))]
    if kind == "bytes":
        blob = draw(st.binary(max_size=256))
    return blob


@FUZZ
@given(safetensors_files())
def test_fuzz_safetensors(blob: bytes) -> None:
    path = _workdir() / "model.safetensors"
    path.write_bytes(blob)
    try:
        attempt("safetensors", path, len(blob), format="safetensors")
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


# Orbax ------------------------------------------------------------------------------------

_ORBAX_SEED = _workdir() / "seed"


def _orbax_seed() -> Path:
    if not (_ORBAX_SEED / "_METADATA").exists():
        import orbax.checkpoint as ocp

        tree = {
            "params": {
                "w": np.arange(12, dtype=np.float32).reshape(3, 4),
                "b": np.ones(4, np.float32),
            },
            "layers": [np.arange(3)],
            "name": "m",
        }
        ocp.PyTreeCheckpointer().save(_ORBAX_SEED, tree)
    return _ORBAX_SEED


@st.composite
def orbax_mutations(draw) -> tuple[str, object]:
    kind = draw(
        st.sampled_from(
            [
                "metadata_entry",
                "metadata_random",
                "metadata_key",
                "data_flip",
                "data_truncate",
                "strings",
            ]
        )
    )
    if kind == "data_flip":
        return kind, (draw(st.integers(0, 10**6)), draw(st.integers(1, 255)))
    if kind == "data_truncate":
        return kind, draw(st.floats(0, 1))
    return kind, draw(json_values)


@FUZZ
@given(orbax_mutations())
def test_fuzz_orbax(mutation) -> None:
    kind, value = mutation
    folder = _workdir() / "ckpt"
    shutil.copytree(_orbax_seed(), folder)
    try:
        metadata_file = folder / "_METADATA"
        metadata = json.loads(metadata_file.read_text())
        entries = list(metadata["tree_metadata"].values())
        if kind == "metadata_entry":
            entries[0]["value_metadata"] = value
        elif kind == "metadata_key":
            entries[-1]["key_metadata"] = value
        elif kind == "metadata_random":
            metadata = value
        elif kind == "strings":
            (folder / "_strings.json").write_text(json.dumps(value))
        else:
            data_files = sorted(
                p for p in folder.rglob("*") if p.is_file() and p.parent.name == "d"
            )
            target = data_files[len(data_files) // 2]
            blob = bytearray(target.read_bytes())
            if kind == "data_flip" and blob:
                position, xor = value
                blob[position % len(blob)] ^= xor
            else:
                blob = blob[: int(len(blob) * value)]
            target.write_bytes(bytes(blob))
        if kind.startswith("metadata"):
            metadata_file.write_text(json.dumps(metadata))
        attempt("orbax", folder, sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()))
    finally:
        shutil.rmtree(folder.parent, ignore_errors=True)


# Flax msgpack -----------------------------------------------------------------------------


def _msgpack_seed() -> bytes:
    from flax import serialization

    return serialization.to_bytes(
        {"params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, "step": 3, "s": "x"}
    )


@FUZZ
@given(st.data())
def test_fuzz_msgpack(data) -> None:
    blob = bytearray(_msgpack_seed())
    kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "bytes"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    elif kind == "insert":
        position = data.draw(st.integers(0, len(blob)))
        blob[position:position] = data.draw(st.binary(min_size=1, max_size=16))
    else:
        blob = bytearray(b"\x81" + data.draw(st.binary(max_size=128)))
    path = _workdir() / "state.msgpack"
    path.write_bytes(bytes(blob))
    try:
        attempt("msgpack", path, len(blob), format="msgpack")
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)


# npz --------------------------------------------------------------------------------------


def _npz_seed(compressed: bool) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(
        buffer, w=np.arange(20, dtype=np.float32).reshape(4, 5), b=np.ones(3)
    )
    return buffer.getvalue()


@FUZZ
@given(st.data())
def test_fuzz_npz(data) -> None:
    blob = bytearray(_npz_seed(data.draw(st.booleans())))
    kind = data.draw(st.sampled_from(["flip", "truncate", "header"]))
    if kind == "flip":
        for _ in range(data.draw(st.integers(1, 4))):
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    else:  # rewrite a member's .npy header
        with zipfile.ZipFile(io.BytesIO(bytes(blob))) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        header = data.draw(st.text(max_size=80)).encode()
        members["w.npy"] = (
            b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + members["w.npy"][128:]
        )
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            for name, content in members.items():
                archive.writestr(name, content)
        blob = bytearray(out.getvalue())
    path = _workdir() / "arrays.npz"
    path.write_bytes(bytes(blob))
    try:
        attempt("npz", path, len(blob), format="npz")
    finally:
        shutil.rmtree(path.parent, ignore_errors=True)
