"""Opening checkpoints: one module per format; `open_source` detects which one by content."""

from __future__ import annotations

import os
import zipfile
from typing import Any

from .._errors import (
    ArgumentError,
    CheckpointNotFoundError,
    NotACheckpointError,
    UnsupportedError,
)
from .._location import (
    MAX_METADATA_BYTES,
    Location,
    RemoteLocation,
    location_of,
    metadata_read_once,
    probe_ahead,
    read_ahead,
)
from .._location.hub_cache import missing_repo_error
from .._location.publish import COMMIT_SUCCESS_FILE
from .checkpoint import Checkpoint

FORMATS = ("orbax", "safetensors", "msgpack", "npz", "torch", "memory")


def open_source(
    source: Any,
    *,
    step: int | None = None,
    item: str | None = None,
    format: str | None = None,  # noqa: A002
    separator: str = ".",
    allow_pickle: bool = False,
    dequantize: bool | str = False,
    dequantize_dtype: Any = "bfloat16",
) -> Checkpoint:
    """Opens `source` lazily; see `suture.open` (``dequantize="auto"``: if quantized).

    On a bucket, each listing and small read the detection and the opening make is asked
    once (`metadata_read_once`): they ask the same questions in several places.
    """
    with metadata_read_once():
        return _open_source(
            source, step, item, format, separator, allow_pickle, dequantize, dequantize_dtype
        )


def _open_source(
    source: Any,
    step: int | None,
    item: str | None,
    format: str | None,  # noqa: A002
    separator: str,
    allow_pickle: bool,
    dequantize: bool | str,
    dequantize_dtype: Any,
) -> Checkpoint:
    if isinstance(source, Checkpoint):
        return source
    if format is not None and format not in FORMATS:
        raise ArgumentError(f"Unknown format {format!r}. Known formats: {', '.join(FORMATS)}.")
    if not isinstance(source, (str, os.PathLike, Location)):  # etils.epath.Path is PathLike
        if step is not None or item is not None:
            given = "step=" if step is not None else "item="
            raise ArgumentError(
                f"{given} applies to CheckpointManager folders, not in-memory trees."
            )
        from .memory import open_memory  # a format plugin: loaded for the format found

        return open_memory(source)
    if format == "memory":
        raise ArgumentError("format='memory' is for in-memory trees, not paths.")
    path = location_of(source)
    if isinstance(source, str) and not path.is_remote and not path.exists():
        missing_repo = missing_repo_error(source)  # 'org/name': not local, not in the HF cache
        if missing_repo is not None:
            raise missing_repo
    if format is not None and not path.exists():
        raise CheckpointNotFoundError(f"No such file or folder: {str(path)!r}. Check the path.")
    if not path.is_remote and path.exists() and not (path.is_dir() or path.is_file()):
        raise NotACheckpointError(
            f"{str(path)!r} is neither a regular file nor a folder (a pipe, socket or device), "
            f"so it cannot be read lazily, and reading it could wait forever. Save the stream "
            f"to a file first."
        )
    kind = format or detect(path)
    if dequantize is True and kind != "safetensors":
        raise UnsupportedError(
            f"{str(path)!r} is {kind}; dequantize=True reads Hugging Face safetensors folders "
            f"whose config.json has a quantization_config (FP8 block scales, MXFP4, FP4, "
            f"compressed-tensors INT and NVFP4) or a ModelOpt hf_quant_config.json."
        )
    checkpoint = _open_path(
        path, kind, step, item, separator, allow_pickle, dequantize, dequantize_dtype
    )
    if kind != "orbax":  # an Orbax source's origin is its (step's) folder already
        _record_folder(checkpoint, path)
    return checkpoint


def _open_path(
    path: Location,
    kind: str,
    step: int | None,
    item: str | None,
    separator: str,
    allow_pickle: bool,
    dequantize: bool | str,
    dequantize_dtype: Any,
) -> Checkpoint:
    if (step is not None or item is not None) and kind != "orbax":
        given = "step=" if step is not None else "item="
        raise ArgumentError(
            f"{given} applies to Orbax CheckpointManager folders, not {kind} files."
        )
    if kind == "orbax":
        from .orbax import open_orbax  # a format plugin: loaded for the format found

        return open_orbax(path, step=step, item=item)
    if kind == "safetensors":
        from .safetensors import open_safetensors  # a format plugin: loaded for the format found

        return open_safetensors(path, separator, dequantize, dequantize_dtype)
    if kind == "msgpack":
        from .msgpack import open_msgpack  # a format plugin: loaded for the format found

        return open_msgpack(path)
    if kind == "npz":
        from .npz import open_npz  # a format plugin: loaded for the format found

        return open_npz(path)
    if path.is_remote:
        raise UnsupportedError(
            f"{str(path)!r} is a PyTorch file, which suture opens only from a local path (torch "
            f"memory-maps it). Copy it locally, or convert it to safetensors first."
        )
    from .torch import open_torch  # a format plugin: loaded for the format found

    return open_torch(path.path, allow_pickle, separator)  # type: ignore[attr-defined]


_FILE_SUFFIXES = (".safetensors", ".msgpack", ".npz", ".pt", ".pth", ".bin")


def _record_folder(checkpoint: Checkpoint, path: Location) -> None:
    """Marks each source with the folder it was opened from (see `SourceNode.folder`)."""
    if path.name.endswith(".index.json"):
        folder = path.parent
    elif not path.name.endswith(_FILE_SUFFIXES) and path.is_dir():
        folder = path
    else:
        return
    for leaf in checkpoint.arrays().values():
        for source in leaf.sources():
            if source.folder is None:
                source.folder = str(folder)


def detect(path: Location) -> str:
    """The format of `path`, from its content (and, for folders, what they hold).

    A remote file is recognised by one small ranged read; a remote folder by the files its
    format puts at known names, listing it only when those are absent.

    Raises:
        CheckpointNotFoundError: `path` does not exist.
        NotACheckpointError: when no known format matches; the message says what was found.
    """
    if path.name.endswith(".safetensors.index.json"):
        if not path.is_file():
            raise CheckpointNotFoundError(f"No such file: {str(path)!r}. Check the path.")
        return "safetensors"
    if path.is_remote and not path.name.endswith(_FILE_SUFFIXES):
        # a file, or an Orbax folder (its two metadata names): asked at once (on a bucket,
        # within open_source), not in three round trips one after another
        probe_ahead([path, path / "_METADATA", path / "_CHECKPOINT_METADATA"])
    is_file = path.is_file() if path.is_remote else not path.is_dir()
    if not is_file:
        from .orbax_layout import (  # a format plugin: loaded for the format found
            is_orbax_folder,
            resolve,
        )
        from .safetensors import INDEX_SUFFIX  # a format plugin: loaded for the format found

        safetensors = (".safetensors", f".safetensors{INDEX_SUFFIX}")
        if is_orbax_folder(path) and not _beside_step_names(path, safetensors):
            # what opening it reads next, read at once (on a bucket, within open_source)
            read_ahead(
                [
                    path / name
                    for name in ("_CHECKPOINT_METADATA", "_METADATA", COMMIT_SUCCESS_FILE)
                ],
                MAX_METADATA_BYTES,
            )
            return "orbax"
        if any(name.endswith(safetensors) for name in _safetensors_probe(path)):
            return "safetensors"
        resolve(path)  # raises the Orbax layout's own explanation of what the folder holds
        return "orbax"
    if not path.exists():
        raise CheckpointNotFoundError(f"No such file or folder: {str(path)!r}. Check the path.")
    size = None if path.is_remote else path.size()
    head = path.read_head(16)
    if head[:4] == b"PK\x03\x04":
        return _zip_kind(path)
    if (
        len(head) >= 9
        and head[8:9] == b"{"
        and (size is None or int.from_bytes(head[:8], "little") <= size - 8)
    ):
        return "safetensors"
    if head[:1] == b"\x80" and len(head) > 1 and head[1] in (2, 3, 4, 5):
        return "torch"  # a legacy (non-zip) torch.save pickle
    if head[:1] and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF)):
        return "msgpack"
    raise NotACheckpointError(
        f"{str(path)!r} is a file in no format suture knows (it starts with {head[:8]!r}). "
        f"suture reads Orbax folders, safetensors, Flax msgpack, npz and PyTorch files; pass "
        f"format= if the content is one of them."
    )


def _beside_step_names(folder: Location, suffixes: tuple[str, ...]) -> bool:
    """Whether `folder`, taken for a CheckpointManager root by its subfolders' names
    (``run_2``), holds safetensors of its own and no step that is an Orbax checkpoint: a
    Hugging Face folder, not a root. Asks nothing more of a root with an Orbax file at its
    top, and, for other roots, reads the listing the steps were found in first."""
    # a format plugin: loaded for the format found
    from .orbax_layout import CHECKPOINT_METADATA, PYTREE_METADATA, no_step_is_a_checkpoint

    if (folder / PYTREE_METADATA).is_file() or (folder / CHECKPOINT_METADATA).is_file():
        return False
    if not any(name.endswith(suffixes) for name in folder.children()):
        return False
    return no_step_is_a_checkpoint(folder)


def _safetensors_probe(folder: Location) -> list[str]:
    """Names telling whether `folder` holds safetensors; lists only when no usual name is there."""
    from .safetensors import SINGLE_NAMES  # a format plugin: loaded for the format found

    found = [name for name in SINGLE_NAMES if (folder / name).is_file()]
    if found:
        return found
    if isinstance(folder, RemoteLocation) and folder.scheme in ("http", "https"):
        return folder.children()  # raises: says what to pass instead of an HTTP folder
    if not folder.exists():
        raise CheckpointNotFoundError(f"No such file or folder: {str(folder)!r}. Check the path.")
    return folder.children()


def _zip_kind(path: Location) -> str:
    try:
        with path.open_reader() as raw, zipfile.ZipFile(raw) as archive:  # zipfile leaves raw open
            names = archive.namelist()
    except zipfile.BadZipFile as error:
        raise NotACheckpointError(
            f"{str(path)!r} looks like a zip archive but cannot be read: {error}."
        ) from error
    if any(name.endswith("data.pkl") for name in names):
        return "torch"
    if names and all(name.endswith(".npy") for name in names):
        return "npz"
    raise NotACheckpointError(
        f"{str(path)!r} is a zip archive holding {', '.join(names[:5]) or 'nothing'}, neither an "
        f".npz nor a PyTorch file."
    )
