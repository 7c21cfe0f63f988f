"""Hostile and unusual PyTorch and npz files that once read as garbage or crashed.

Each test writes the input with the stock writer (``torch.save``, numpy), bends it where a
damaged disk or an attacker would, and checks that suture reads what torch or numpy reads,
or refuses it with a `SurgeryError` naming the tensor; where the stock reader refuses the
input too, the test shows it.
"""

from __future__ import annotations

import io
import struct
import tracemalloc
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import suture

torch = pytest.importorskip("torch", reason="the torch extra is not installed")


def _rewrite(source: Path, target: Path, change) -> None:
    """`source`'s zip entries written again into `target`, each through ``change(info, data)``."""
    with zipfile.ZipFile(source) as archive:
        entries = [(info, archive.read(info)) for info in archive.infolist()]
    with zipfile.ZipFile(target, "w") as archive:
        for info, data in entries:
            archive.writestr(info, change(info, data))


def _central_entry(data: bytes, name: bytes) -> int:
    """Where the central directory's entry for `name` starts."""
    entry = data.index(b"PK\x01\x02")
    while data[entry + 46 : entry + 46 + len(name)] != name:
        entry = data.index(b"PK\x01\x02", entry + 1)
    return entry


def _as_numpy(tensor) -> np.ndarray:
    tensor = tensor.detach().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def _open(path: Path, **options) -> suture.Checkpoint:
    return suture.open(path, allow_pickle=True, **options)


# Item 1: records torch memory-maps without checking them


def test_a_torch_record_shorter_than_its_storage_is_refused(tmp_path: Path) -> None:
    torch.save({"w": torch.arange(100.0)}, tmp_path / "a.pt")
    short = tmp_path / "short.pt"
    _rewrite(tmp_path / "a.pt", short, lambda i, d: d[:40] if i.filename.endswith("data/0") else d)
    with pytest.raises(RuntimeError, match="record size"):  # torch refuses it without mmap
        torch.load(short, weights_only=True)
    with pytest.raises(
        suture.CorruptCheckpointError,
        match=r"Tensor 'w' of .*short.pt.*storage needs 400 bytes.*record 'a/data/0' declares 40",
    ):
        _open(short)


def test_a_torch_record_whose_zip_sizes_lie_is_refused(tmp_path: Path) -> None:
    """The central directory claims 400 bytes of a record that holds 40: torch's mmap would
    read the next entry's header as the tensor's last values."""
    torch.save({"w": torch.arange(100.0)}, tmp_path / "a.pt")
    short = tmp_path / "short.pt"
    _rewrite(tmp_path / "a.pt", short, lambda i, d: d[:40] if i.filename.endswith("data/0") else d)
    data = bytearray(short.read_bytes())
    entry = _central_entry(data, b"a/data/0")
    struct.pack_into("<II", data, entry + 20, 400, 400)  # compressed and uncompressed sizes
    lying = tmp_path / "lying.pt"
    lying.write_bytes(bytes(data))
    with pytest.raises(suture.CorruptCheckpointError, match=r"Tensor 'w'.*the 40 before the next"):
        _open(lying)


def test_compressed_torch_records_read_as_torch_reads_them(tmp_path: Path) -> None:
    """torch.save never compresses, but torch.load (without mmap) inflates a record that is."""
    base = torch.arange(24.0).reshape(4, 6)
    state = {"w": base, "t": base.T, "h": torch.randn(3, 5).to(torch.bfloat16)}
    torch.save(state, tmp_path / "a.pt")
    deflated = tmp_path / "deflated.pt"

    def compress(info: zipfile.ZipInfo, data: bytes) -> bytes:
        info.compress_type = zipfile.ZIP_DEFLATED
        return data

    _rewrite(tmp_path / "a.pt", deflated, compress)
    expected = torch.load(deflated, weights_only=True)
    checkpoint = _open(deflated)
    for name, tensor in expected.items():
        np.testing.assert_array_equal(checkpoint[name].read(), _as_numpy(tensor), err_msg=name)
    np.testing.assert_array_equal(checkpoint["t"][1:3, 2].read(), base.T[1:3, 2].numpy())


def test_a_compressed_record_inflates_only_up_to_the_tensor_it_holds(tmp_path: Path) -> None:
    """A 4-element view of a 64 MiB storage of zeros (64 KiB compressed) inflates 16 bytes."""
    torch.save({"head": torch.zeros(1 << 24)[:4]}, tmp_path / "a.pt")

    def compress(info: zipfile.ZipInfo, data: bytes) -> bytes:
        info.compress_type = zipfile.ZIP_DEFLATED
        return data

    _rewrite(tmp_path / "a.pt", tmp_path / "bomb.pt", compress)
    assert (tmp_path / "bomb.pt").stat().st_size < 1 << 20
    array = _open(tmp_path / "bomb.pt")["head"]
    tracemalloc.start()
    values = array.read()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert values.tolist() == [0.0] * 4
    assert peak < 8 << 20, f"{peak} bytes allocated to read 16"


def test_a_damaged_compressed_record_is_an_error_naming_the_tensor(tmp_path: Path) -> None:
    torch.manual_seed(0)
    torch.save({"w": torch.randn(4096)}, tmp_path / "a.pt")

    def compress(info: zipfile.ZipInfo, data: bytes) -> bytes:
        info.compress_type = zipfile.ZIP_DEFLATED
        return data

    _rewrite(tmp_path / "a.pt", tmp_path / "deflated.pt", compress)
    data = bytearray((tmp_path / "deflated.pt").read_bytes())
    start = data.index(b"a/data/0") + len(b"a/data/0")
    data[start + 200 : start + 300] = bytes(100)  # inside the record's deflate stream
    (tmp_path / "damaged.pt").write_bytes(bytes(data))
    saved = torch.load(tmp_path / "a.pt", weights_only=True)["w"]
    inflated = torch.load(tmp_path / "damaged.pt", weights_only=True)["w"]
    assert not torch.equal(inflated, saved)  # torch does not check the CRC: wrong values
    with pytest.raises(suture.CorruptCheckpointError, match=r"Tensor 'w' .*record 'a/data/0'"):
        _open(tmp_path / "damaged.pt")["w"].read()


def test_a_big_endian_torch_file_reads_as_torch_reads_it(tmp_path: Path) -> None:
    """A file saved on a big-endian machine: torch swaps each number's bytes back."""
    state = {
        "f": torch.arange(6.0).reshape(2, 3),
        "t": torch.arange(6.0).reshape(2, 3).T,
        "c": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64),
        "h": torch.tensor([1.5, -2.0]).to(torch.bfloat16),
    }
    torch.save(state, tmp_path / "little.pt")
    swap = {"0": "<f4", "1": "<f4", "2": "<f4", "3": "<u2"}  # each storage's unit of bytes

    def to_big(info: zipfile.ZipInfo, data: bytes) -> bytes:
        if info.filename.endswith("byteorder"):
            return b"big"
        key = info.filename.rpartition("data/")[2] if "/data/" in info.filename else None
        if key in swap:
            return np.frombuffer(data, swap[key]).byteswap().tobytes()
        return data

    _rewrite(tmp_path / "little.pt", tmp_path / "big.pt", to_big)
    expected = torch.load(tmp_path / "big.pt", weights_only=True)
    checkpoint = _open(tmp_path / "big.pt")
    for name, tensor in state.items():
        np.testing.assert_array_equal(_as_numpy(expected[name]), _as_numpy(tensor), err_msg=name)
        np.testing.assert_array_equal(checkpoint[name].read(), _as_numpy(tensor), err_msg=name)


# Item 2: names that become one tree path


def test_torch_names_that_collide_as_tree_paths_are_refused(tmp_path: Path) -> None:
    torch.save({"a/b": torch.ones(2), "a.b": torch.zeros(2)}, tmp_path / "collide.pt")
    assert len(torch.load(tmp_path / "collide.pt", weights_only=True)) == 2
    with pytest.raises(
        suture.PathConflictError, match=r"Tensors 'a/b' and 'a.b' .* both become the tree path"
    ):
        _open(tmp_path / "collide.pt")
    kept = _open(tmp_path / "collide.pt", separator="/")  # the fix the message names
    assert kept["a.b"].read().tolist() == [0.0, 0.0]


def test_a_torch_name_holding_backslash_x00_stays_whole(tmp_path: Path) -> None:
    """Nested keys were once joined on the four characters ``\\x00``, not on a NUL, so a
    name holding that text was split there."""
    torch.save({"w\\x00v": torch.ones(2), "n": {"m": torch.zeros(1)}}, tmp_path / "a.pt")
    checkpoint = _open(tmp_path / "a.pt", separator="/")
    assert sorted(checkpoint.paths()) == ["n/m", "w\\x00v"]


# Item 4: dtypes numpy lacks


@pytest.mark.parametrize("name", ["float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"])
def test_torch_float8_variants_read_bit_exact(tmp_path: Path, name: str) -> None:
    tensor = torch.tensor([1.0, 2.0, 4.0, 0.5]).to(getattr(torch, name))
    torch.save({"x": tensor}, tmp_path / "a.pt")
    with pytest.raises(TypeError):  # torch cannot hand it to numpy either
        tensor.numpy()
    leaf = _open(tmp_path / "a.pt")["x"]
    assert leaf.dtype == np.dtype(getattr(ml_dtypes, name))
    values = leaf.read()
    assert values.view(np.uint8).tolist() == tensor.view(torch.uint8).tolist()
    assert values.astype(np.float32).tolist() == [1.0, 2.0, 4.0, 0.5]


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_a_complex32_tensor_is_refused_at_the_open_naming_the_cast(tmp_path: Path) -> None:
    tensor = torch.tensor([1.0, 2.0]).to(torch.complex32)
    torch.save({"x": tensor}, tmp_path / "a.pt")
    with pytest.raises(TypeError):  # numpy has no complex32
        tensor.numpy()
    with pytest.raises(
        suture.UnsupportedError, match=r"Tensor 'x' .* complex32.*tensor.to\(torch.complex64\)"
    ):
        _open(tmp_path / "a.pt")


# Item 5: parameters saved with requires_grad


@pytest.mark.parametrize("legacy", [False, True])
def test_torch_parameters_that_require_grad_read(tmp_path: Path, legacy: bool) -> None:
    state = torch.nn.Linear(2, 3).state_dict(keep_vars=True)
    torch.save(state, tmp_path / "a.pt", _use_new_zipfile_serialization=not legacy)
    with pytest.raises(RuntimeError, match="requires grad"):  # as torch hands them to numpy
        torch.load(tmp_path / "a.pt", weights_only=True)["weight"].numpy()
    loaded = suture.load(_open(tmp_path / "a.pt"))
    for name, tensor in state.items():
        np.testing.assert_array_equal(loaded[name], tensor.detach().numpy(), err_msg=name)


# Item 6: tensors without dense data


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize(
    ("kind", "message"),
    [("coo", "sparse tensor \\(sparse_coo\\).*to_dense"), ("csr", "sparse_csr.*to_dense")]
    + [("meta", "holds no data: it was saved on the meta device.*real device")],
)
@pytest.mark.parametrize("legacy", [False, True])
def test_sparse_and_meta_tensors_are_refused_at_the_open(
    tmp_path: Path, kind: str, message: str, legacy: bool
) -> None:
    tensors = {
        "coo": lambda: torch.eye(3).to_sparse(),
        "csr": lambda: torch.eye(3).to_sparse_csr(),
        "meta": lambda: torch.empty(2, 3, device="meta"),
    }
    path = tmp_path / f"{kind}.pt"
    torch.save({"x": tensors[kind]()}, path, _use_new_zipfile_serialization=not legacy)
    with pytest.raises(suture.UnsupportedError, match=f"Tensor 'x' of .*{kind}.pt' .*{message}"):
        _open(path)


# Item 7: legacy files


def test_a_legacy_torch_file_reads(tmp_path: Path) -> None:
    state = {"w": torch.arange(4.0), "b": torch.randn(2, 3).to(torch.bfloat16).T}
    torch.save(state, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    checkpoint = _open(tmp_path / "old.pt")
    for name, tensor in state.items():
        np.testing.assert_array_equal(checkpoint[name].read(), _as_numpy(tensor), err_msg=name)


# npz, items 3 and 8


def test_an_npz_stored_member_shorter_than_its_header_is_refused(tmp_path: Path) -> None:
    """Its zip entry stores 40 of the 800 data bytes its .npy header and central directory
    declare: suture once read the next member's bytes as its values."""
    path = tmp_path / "short.npz"
    full = io.BytesIO()
    np.lib.format.write_array(full, np.arange(100.0))
    whole = full.getvalue()
    other = io.BytesIO()
    np.lib.format.write_array(other, np.full(200, 7.0))
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("a.npy", whole[: len(whole) - 760])
        archive.writestr("b.npy", other.getvalue())
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, data.index(b"PK\x01\x02") + 24, len(whole))  # uncompressed size
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="EOF"):  # numpy refuses it too
        np.load(path)["a"]
    with pytest.raises(
        suture.CorruptCheckpointError, match=r"Member 'a' of .*short.npz.*declares 928 bytes"
    ):
        suture.open(path)


@pytest.mark.parametrize("descr", [[], "|V0", "|S0", "<U0"])
def test_npz_members_of_zero_byte_elements_are_refused_at_the_open(
    tmp_path: Path, descr: object
) -> None:
    """np.load reads them as arrays of empty records; suture refuses them at once, even of a
    shape of 2**60 elements, without allocating."""
    member = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": (1 << 60,)}
    np.lib.format.write_array_header_1_0(member, header)
    path = tmp_path / "zero.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("x.npy", member.getvalue())
    np.savez(tmp_path / "small.npz", x=np.zeros(4, dtype=[]))
    assert np.load(tmp_path / "small.npz")["x"].shape == (4,)
    for case in (path, tmp_path / "small.npz"):
        tracemalloc.start()
        with pytest.raises(suture.UnsupportedError, match=r"Member 'x' .*zero bytes per element"):
            suture.open(case)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 8 << 20


def test_a_file_of_torch_before_2_7_reads_each_tensor_from_its_own_record(tmp_path: Path) -> None:
    """torch before 2.7 wrote the records in the text order of their names (data/0, data/1,
    data/10, data/11, data/2, ...) and no .format_version: more than ten storages of one size
    once read each other's records, in order. Each is matched by where its data starts."""
    tensors = {f"layer{i}.w": torch.full((4, 4), float(i)) for i in range(12)}
    torch.save(tensors, tmp_path / "new.bin")
    with zipfile.ZipFile(tmp_path / "new.bin") as new:
        names = new.namelist()
        data = sorted((n for n in names if "/data/" in n), key=lambda n: n.rpartition("/")[2])
        rest = [n for n in names if "/data/" not in n and not n.endswith("_version")]
        rest = [n for n in rest if not n.endswith(".storage_alignment")]
        with zipfile.ZipFile(tmp_path / "old.bin", "w", zipfile.ZIP_STORED) as old:
            for name in rest + data:
                old.writestr(name, new.read(name))
    reference = torch.load(tmp_path / "old.bin", weights_only=True)
    opened = suture.open(tmp_path / "old.bin", allow_pickle=True)
    for name, values in tensors.items():
        assert torch.equal(reference[name], values)
        np.testing.assert_array_equal(opened[name.replace(".", "/")].read(), values.numpy())
