"""Hostile inputs: every mutated file ends in a SurgeryError or a correct read, never a crash.

Each reader gets hypothesis-made inputs: mutated safetensors headers (sizes, offsets, shapes,
dtypes, names, lengths past the end), mutated Orbax ``_METADATA`` and data files, mutated
Flax msgpack bytes, mutated npz archives. `make test` runs a fast subset; `make fuzz` runs
``SUTURE_FUZZ_EXAMPLES`` (10,000) cases per reader and, with ``SUTURE_FUZZ_REPORT`` set,
writes the counts of outcomes by kind to that file.

The hostile kinds (names nested thousands of levels deep or made of ``..``, NUL and
undecodable text; huge, negative and overflowing shapes; zip bombs; recipe files) run
under an address-space limit (``RLIMIT_AS``, 2 GiB above what the process maps), so an
input that makes a reader allocate what it declares fails fast instead of exhausting the
machine, and it must fail as a SurgeryError.
"""

from __future__ import annotations

import io
import json
import os
import resource
import shutil
import struct
import tempfile
import tracemalloc
import warnings
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
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
        with warnings.catch_warnings():  # what suture says of odd but readable input is no crash
            warnings.simplefilter("ignore", suture.SutureWarning)
            ckpt = suture.open(path, **open_options)
            for leaf in ckpt.arrays().values():
                leaf.read()
        outcome = "read"
    except suture.SurgeryError as error:
        outcome = type(error).__name__
        if isinstance(error.__context__, MemoryError):  # stopped by the RLIMIT_AS cap
            outcome += " (memory limit)"
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    OUTCOMES.setdefault(reader, Counter())[outcome] += 1
    assert outcome.endswith("(memory limit)") or peak < 64 * 2**20 + 16 * size, (
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


MEMORY_HEADROOM = 2 << 30  # address space the fuzzing process may add to what it holds


@pytest.fixture(scope="module", autouse=True)
def memory_limit():
    """Caps the process's address space (RLIMIT_AS) a little above what it already maps.

    A hostile input that makes a reader allocate more fails at once with a MemoryError
    (which suture reports as a SurgeryError) instead of filling the machine's memory.
    """
    import flax.serialization  # noqa: F401  (map the libraries before measuring)
    import orbax.checkpoint  # noqa: F401

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    mapped = _mapped_bytes()
    limit = mapped + MEMORY_HEADROOM
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    yield limit
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _mapped_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmSize in /proc/self/status")


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


# Hostile kinds: deep nesting, huge and negative shapes, zip bombs, names, recipes -----------

HOSTILE_NAMES = ["..", ".", "", "/", "a/../b", "\x00", "\udcff", "x" * 300, "é", "__metadata__"]


@st.composite
def tree_names(draw) -> list[str]:
    """Tensor names nested from 1 to 3,000 levels, with hostile components."""
    depth = draw(st.sampled_from([1, 2, 8, 300, 1100, 3000]))
    component = draw(st.sampled_from(["k", *HOSTILE_NAMES]))
    return [".".join([component] * depth), draw(st.sampled_from(["w", *HOSTILE_NAMES]))]


@pytest.fixture(scope="module")
def seeds() -> None:
    """The Orbax seeds, written once before the timed cases."""
    _orbax_seed()
    _orbax_files_seed()


# past a few hundred examples, hypothesis meets name lists whose repr exceeds 30 kB and warns
# that printing them is expensive (its own warning, about its report, not about suture)
@pytest.mark.filterwarnings(
    "ignore:Generating overly large repr:hypothesis.errors.HypothesisWarning"
)
@FUZZ
@given(st.sampled_from(["safetensors", "npz", "msgpack", "orbax"]), tree_names())
def test_fuzz_deep_and_hostile_names(seeds: None, reader: str, names: list[str]) -> None:
    import msgpack

    folder = _workdir()
    arrays = {name: np.ones(2, np.float32) for name in names}
    try:
        if reader == "safetensors":
            header, offset = {}, 0
            for name in arrays:
                header[name] = {"dtype": "F32", "shape": [2], "data_offsets": [offset, offset + 8]}
                offset += 8
            raw = json.dumps(header).encode()
            path = folder / "m.safetensors"
            path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))
        elif reader == "npz":
            path = folder / "m.npz"
            with zipfile.ZipFile(path, "w") as archive:
                members: set[str] = set()
                for name, array in arrays.items():
                    member = io.BytesIO()
                    np.save(member, array)
                    member_name = name.replace(".", "/").replace(
                        "\x00", "0"
                    )  # zip ends names at NUL
                    member_name = member_name.encode("utf-8", "replace").decode() + ".npy"
                    # a zip member's name is at most 65535 bytes: no such file can exist
                    assume(len(member_name.encode()) <= 0xFFFF)
                    assume(member_name not in members)  # two names made one member name
                    members.add(member_name)
                    archive.writestr(member_name, member.getvalue())
        elif reader == "msgpack":
            node: object = {names[1].encode("utf-8", "replace").decode(): 1.0}
            for _ in range(min(names[0].count(".") + 1, 1000)):  # msgpack's own limit is 1024
                node = {"k": node}
            path = folder / "m.msgpack"
            path.write_bytes(msgpack.packb(node))
        else:
            path = folder / "ckpt"
            shutil.copytree(_orbax_seed(), path)
            metadata = json.loads((path / "_METADATA").read_text())
            entry = next(iter(metadata["tree_metadata"].values()))
            entry["key_metadata"] = [
                {"key": key, "key_type": 2} for key in names[0].split(".") + [names[1]]
            ]
            (path / "_METADATA").write_text(json.dumps(metadata))
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        attempt(f"{reader} (names)", path, size, format=reader)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


shape_values = st.lists(
    st.sampled_from([-1, -5, 0, 1, 3, 2**31, 2**34, 2**40, 2**62, 2**63 - 1, 2**70]),
    min_size=0,
    max_size=4,
)


_ORBAX_FILES_SEED = _workdir() / "seed-files"


def _orbax_files_seed() -> Path:
    if not (_ORBAX_FILES_SEED / "_METADATA").exists():
        import orbax.checkpoint as ocp

        ocp.PyTreeCheckpointer(use_ocdbt=False, use_zarr3=False).save(
            _ORBAX_FILES_SEED, {"w": np.arange(6, dtype=np.float32)}
        )
    return _ORBAX_FILES_SEED


@FUZZ
@given(st.sampled_from(["safetensors", "orbax", "msgpack", "npz"]), shape_values)
def test_fuzz_huge_and_negative_shapes(seeds: None, reader: str, shape: list[int]) -> None:
    import msgpack

    folder = _workdir()
    try:
        if reader == "safetensors":
            header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 24]}}
            raw = json.dumps(header).encode()
            path = folder / "m.safetensors"
            path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(24))
        elif reader == "orbax":
            path = folder / "ckpt"
            shutil.copytree(_orbax_files_seed(), path)
            zarray = path / "w" / ".zarray"
            described = json.loads(zarray.read_text())
            zarray.write_text(json.dumps({**described, "shape": shape}))
        elif reader == "msgpack":
            path = folder / "m.msgpack"
            packable = [min(n, 2**63 - 1) for n in shape]
            array = msgpack.ExtType(1, msgpack.packb((packable, "float32", bytes(24))))
            path.write_bytes(msgpack.packb({"w": array}))
        else:
            path = folder / "m.npz"
            header = repr({"descr": "<f4", "fortran_order": False, "shape": tuple(shape)}).encode()
            npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(24)
            with zipfile.ZipFile(path, "w") as archive:
                archive.writestr("w.npy", npy)
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        attempt(f"{reader} (shapes)", path, size, format=reader)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@FUZZ
@given(
    st.sampled_from(
        [(1, 1 << 20), (64, 65536), (2**20, 8), (2**40, 1)]
    ),  # declared rows, row bytes
    st.integers(0, 8 << 20),  # bytes actually deflated into the member
    st.booleans(),  # compressed
)
def test_fuzz_zip_bombs(declared: tuple[int, int], content: int, compressed: bool) -> None:
    """Members of up to 8 MiB of zeros (a few KiB deflated) declaring up to 2**40 rows."""
    rows, row_bytes = declared
    folder = _workdir()
    path = folder / "bomb.npz"
    try:
        header = repr({"descr": "|u1", "fortran_order": False, "shape": (rows, row_bytes)})
        header = header.encode() + b" " * (-(len(header) + 11) % 64) + b"\n"
        with (
            zipfile.ZipFile(
                path, "w", zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
            ) as archive,
            archive.open("w.npy", "w", force_zip64=True) as member,
        ):
            member.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)
            for start in range(0, content, 1 << 20):
                member.write(bytes(min(1 << 20, content - start)))
        attempt("npz (zip bombs)", path, path.stat().st_size, format="npz")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


recipe_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                ["pattern", "to", "into", "axis", "sizes", "dtype", "fill", "x", "rule"]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=10,
)


@st.composite
def recipe_files(draw) -> tuple[str, str]:
    """YAML or TOML recipes: rule names with arguments of any type, aliases, deep nesting."""
    from suture._surgery.recipe_schema import RULE_NAMES

    suffix = draw(st.sampled_from(["yaml", "toml"]))
    kind = draw(st.sampled_from(["rules", "rules", "aliases", "deep", "text"]))
    if kind == "text":
        return suffix, draw(st.text(max_size=200))
    if kind == "deep":
        depth = draw(st.sampled_from([10, 600, 5000]))
        return suffix, ("rules = " if suffix == "toml" else "rules: ") + "[" * depth + "]" * depth
    if kind == "aliases":
        fan_out, levels = draw(st.integers(2, 12)), draw(st.integers(1, 9))
        lines = ["a0: &a0 [x]"] + [
            f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan_out)}]" for i in range(1, levels + 1)
        ]
        return "yaml", "\n".join(lines) + f"\nrules: [{{drop: *a{levels}}}]\n"
    rules = [
        {draw(st.sampled_from([*RULE_NAMES, "nope"])): draw(recipe_values)}
        for _ in range(draw(st.integers(1, 3)))
    ]
    if suffix == "yaml":
        import yaml

        return suffix, yaml.safe_dump({"rules": rules})
    tables = []
    for rule in rules:
        ((name, arguments),) = rule.items()
        fields = arguments if isinstance(arguments, dict) else {"pattern": arguments}
        fields = {key: value for key, value in fields.items() if value is not None}
        tables.append(
            "[[rules]]\n"
            + f"rule = {json.dumps(name)}\n"
            + "".join(f"{key} = {_toml_value(value)}\n" for key, value in fields.items())
        )
    return suffix, "\n".join(tables)


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        inner = {k: v for k, v in value.items() if v is not None}
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in inner.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value if v is not None) + "]"
    return json.dumps(value)


@FUZZ
@given(recipe_files())
def test_fuzz_recipes(recipe: tuple[str, str]) -> None:
    """A recipe loads into rules or is a SurgeryError naming where; never a crash or a hang."""
    from suture._surgery.recipes import load_recipe

    suffix, text = recipe
    folder = _workdir()
    path = folder / f"recipe.{suffix}"
    path.write_text(text, errors="surrogateescape")
    tracemalloc.start()
    try:
        built = load_recipe(path).transform
        assert all(isinstance(rule, suture.rules.Rule) for rule in built)
        outcome = "rules"
    except suture.SurgeryError as error:
        assert str(path) in str(error)
        outcome = type(error).__name__
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        shutil.rmtree(folder, ignore_errors=True)
    OUTCOMES.setdefault(f"{suffix} recipes", Counter())[outcome] += 1
    assert peak < 64 * 2**20, f"{peak} bytes allocated for a {len(text)}-character recipe"
