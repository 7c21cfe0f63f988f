"""`suture.load`: read a checkpoint (or a lazy tree) into memory, shaped by a target."""

from __future__ import annotations

import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .._dtypes import cast_changes
from .._errors import (
    ArgumentError,
    ShapeMismatchError,
    SurgeryError,
    TreeMismatchError,
    UnsupportedError,
    raise_problems,
)
from .._exec.distributed import global_array
from .._exec.progress import leaf_progress, wants_progress
from .._format import first_and_more
from .._jaxtypes import is_jax_array, loaded_jax
from .._lazy.array import LazyArray
from .._lazy.array import map as lazy_map
from .._lazy.combine import fit_shape
from .._lazy.graph import MemorySource, open_all
from .._paths import flatten, map_leaves_with_path
from .._surgery.build import transform as lazy_transform
from .._surgery.init import initialize
from .._surgery.orbax_transforms import is_transformations_tree
from .._surgery.targets import (
    AS_STORED,
    PLACEHOLDER,
    LeafTarget,
    classify,
    placeholders_as_stored,
    unwrap_metadata_tree,
)
from ..sources.checkpoint import Checkpoint
from ..sources.open import open as open_checkpoint
from .shardings import metadata_sharding, recorded_sharding
from .staging import read_in_strips, reads_a_file, whole_rows

# Readers mostly wait on TensorStore. With every read of a tree in flight at once, the
# kernel's I/O scheduler serves them in disk order: on a cold cache (bench/partial_load.py)
# 19 reads in flight took 0.82 s, steadily; 4 in flight took 0.86 to 1.49 s.
_READ_THREADS = 64


def load(
    source: Any,
    target: Any = None,
    *,
    partial: bool = False,
    pad_truncate: bool | str = False,
    init: Any = None,
    as_jax: bool = False,
    mesh: Any = None,
    strict: bool | None = None,
    progress: bool | None = None,
) -> Any:
    """Reads `source` into memory, shaped by `target`.

    Args:
        source: a checkpoint path, an opened `Checkpoint`, or a tree holding `LazyArray`s
            (such as the result of `suture.transform`) and plain values.
        target: None for everything as stored, or a tree whose leaves say what to return:
            ``jax.ShapeDtypeStruct`` (with a sharding: each device reads only its shard),
            concrete arrays (their shape and dtype), the types ``np.ndarray``/``jax.Array``
            (as stored, on the host or on the device), Python numbers, Orbax's metadata tree
            (``ocp.metadata(path).metadata``), or ``suture.PLACEHOLDER`` (``...``) to skip a
            leaf; `suture.placeholders` builds such a tree from a checkpoint. Empty
            containers (``optax.EmptyState()``) come back as the target's own objects.
            With jax's 64-bit mode off, a 64-bit leaf (int64, float64) comes back as the
            stored numpy array for a ShapeDtypeStruct of its stored dtype with no sharding
            (as `suture.placeholders` gives); other jax targets get it in jax's 32-bit dtype,
            only where that changes no value.
        partial: skip (never read) source leaves that `target` leaves out, and keep the
            target's own value for a concrete target leaf the source lacks (Orbax's
            ``partial_restore``). Without it, either is an error.
        pad_truncate: zero-pad or truncate each axis where the target's shape differs from
            the stored one. Without it, a different shape is an error (numpy targets
            restore in the stored shape, as in Orbax). ``"mean"`` pads with the mean of the
            existing rows instead of zeros (new tokens of a bigger vocabulary).
        init: values for target leaves that the source lacks: a tree of arrays or of
            ``fn(shape, dtype)`` initializers, or a no-argument function that builds the
            whole tree (run under ``jax.jit``, so only the missing leaves are computed).
        as_jax: with ``target=None``, return ``jax.Array`` instead of numpy arrays.
            ``jax.Array`` leaves with no sharding in the target get the sharding the
            checkpoint recorded, on the devices it names (an error names the leaf when
            this process lacks them).
        mesh: the concrete mesh for target shardings given on an abstract mesh (as
            ``nnx.eval_shape`` gives them); default: the mesh set with ``jax.set_mesh``.
        strict: Orbax's name for the opposite of `pad_truncate`: ``strict=False`` is
            ``pad_truncate=True``.
        progress: a progress bar on stderr; None shows it when stderr is a terminal.

    Returns:
        A tree with the target's structure (the source's, when `target` is None).

    Raises:
        SurgeryError: a placeholder on a subtree, source leaves left out without
            ``partial=True``, target leaves no source or `init` provides, shapes that
            differ without ``pad_truncate=True``, a target shape with a negative size or a
            sharding that does not divide the leaf's shape, a 64-bit value that jax (64-bit
            mode off) would change.

    Example:
        >>> import numpy as np, suture
        >>> ckpt = suture.open({"params": {"w": np.arange(4.0)}, "opt_state": {"mu": np.zeros(4)}})
        >>> suture.load(ckpt, suture.placeholders(ckpt, skip="opt_state"))["opt_state"]
        {'mu': Ellipsis}
        >>> suture.load(ckpt, {"params": {"w": np.zeros(2)}}, partial=True, pad_truncate=True)
        {'params': {'w': array([0., 1.])}}
    """
    pad_truncate = _pad_truncate(pad_truncate, strict)
    tree = _source_tree(source)
    mesh = _callers_mesh(mesh)  # jax.set_mesh is per thread: read it here, not in the readers
    if target is None:
        default = LeafTarget("jax") if as_jax else AS_STORED
        flat_source = flatten(tree)
        results = _read_all(
            {path: (leaf, default) for path, leaf in flat_source.items()},
            pad_truncate,
            show_progress=wants_progress(progress),
        )
        return map_leaves_with_path(lambda path, _: results[path], tree)

    target = unwrap_metadata_tree(target)
    flat_source = flatten(tree)
    flat_target = {path: classify(leaf) for path, leaf in flatten(target).items()}
    _check_placeholders_on_subtrees(flat_target, flat_source)
    problems: list[SurgeryError] = []  # a misspelled key is two problems: report both
    try:
        _check_left_out(flat_target, flat_source, partial)
    except SurgeryError as error:
        problems.append(error)
    missing = {
        path: wanted
        for path, wanted in flat_target.items()
        if wanted.kind not in _NOT_READ and path not in flat_source
    }
    if partial:  # Orbax's partial_restore: a concrete target leaf stays as it is
        missing = {path: wanted for path, wanted in missing.items() if wanted.abstract}
    unmatched = [path for path in flat_source if path not in flat_target]
    try:
        initialized = initialize(init, missing, unmatched or list(flat_source))
    except SurgeryError as error:
        problems.append(error)
    raise_problems(problems, "The load")
    jobs = {
        path: (flat_source[path] if path in flat_source else initialized[path], wanted)
        for path, wanted in flat_target.items()
        if wanted.kind not in _NOT_READ and (path in flat_source or path in initialized)
    }
    results = _read_all(jobs, pad_truncate, mesh, wants_progress(progress))

    def result(path: str, target_leaf: Any) -> Any:
        if path in results:
            return results[path]
        return PLACEHOLDER if target_leaf is PLACEHOLDER else target_leaf

    return map_leaves_with_path(result, target)


_NOT_READ = ("skip", "empty")


PADDINGS = (False, True, "zeros", "mean")


def _pad_truncate(pad_truncate: bool | str, strict: bool | None) -> bool | str:
    if pad_truncate not in PADDINGS:
        raise ArgumentError(
            f"pad_truncate={pad_truncate!r}: pass True (zeros) or 'mean' (new rows are the mean "
            f"of the existing ones)."
        )
    if strict is None:
        return pad_truncate
    if pad_truncate and strict:
        raise ArgumentError(
            "pad_truncate=True and strict=True contradict each other: strict=False is Orbax's "
            "name for pad_truncate=True. Pass one of them."
        )
    return pad_truncate or not strict


def _source_tree(source: Any) -> Any:
    if isinstance(source, Checkpoint):
        return source.tree
    if isinstance(source, (str, os.PathLike)):
        return open_checkpoint(source).tree
    return source


def _check_placeholders_on_subtrees(flat_target: dict[str, LeafTarget], flat_source: dict) -> None:
    for path, wanted in flat_target.items():
        if wanted.kind != "skip" or path in flat_source:
            continue
        below = [key for key in flat_source if key.startswith(path + "/")]
        if below:
            raise TreeMismatchError(
                f"The target puts suture.PLACEHOLDER (...) on {path!r}, which is a subtree "
                f"with {len(below)} leaves (e.g. {below[0]!r}), not a leaf. Put it on each "
                f"leaf: jax.tree.map(lambda _: ..., subtree), or build the target with "
                f"suture.placeholders(ckpt, skip={path!r})."
            )


def _check_left_out(flat_target: dict[str, LeafTarget], flat_source: dict, partial: bool) -> None:
    if partial:
        return
    left_out = [path for path in flat_source if path not in flat_target]
    if left_out:
        raise TreeMismatchError(
            f"The target leaves out {len(left_out)} leaf path(s) that the checkpoint holds: "
            f"{first_and_more(left_out, 5, repr)}. Pass partial=True to skip them (they are not read), or put "
            f"suture.PLACEHOLDER (...) on them (suture.placeholders(ckpt, skip=...))."
        )


def _read_all(
    jobs: dict[str, tuple[Any, LeafTarget]],
    pad_truncate: bool | str,
    mesh: Any = None,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Materializes every job, reading arrays on a few threads (TensorStore releases the GIL)."""
    paths = list(jobs)
    arrays = [leaf for leaf, _ in jobs.values() if isinstance(leaf, LazyArray)]
    open_all([source for array in arrays for source in array.sources()])
    total = sum(array.nbytes for array in arrays)
    with leaf_progress("Reading", total, len(paths), show_progress) as done:

        def read(path: str) -> Any:
            leaf, wanted = jobs[path]
            value = _materialize(path, leaf, wanted, pad_truncate, mesh)
            done(leaf.nbytes if isinstance(leaf, LazyArray) else 0)
            return value

        # Arrays spread over processes are resharded with collectives, which every process
        # must issue in the same order: one at a time, in tree order, on this thread.
        results = {path: read(path) for path in paths if global_array(jobs[path][0]) is not None}
        rest = [path for path in paths if path not in results]
        with ThreadPoolExecutor(max_workers=_READ_THREADS) as pool:
            results.update(zip(rest, pool.map(read, rest), strict=True))
    return {path: results[path] for path in paths}


def _materialize(
    path: str, leaf: Any, wanted: LeafTarget, pad_truncate: bool | str, mesh: Any = None
) -> Any:
    ready = _already_in_place(leaf, wanted)
    if ready is not None:
        return ready
    spanning = global_array(leaf)
    if spanning is not None:
        return _reshard(
            path, spanning, wanted, pad_truncate, _concrete(wanted.sharding, mesh, path)
        )
    if not isinstance(leaf, LazyArray):
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype") and wanted.kind != "stored":
            leaf = LazyArray.from_array(leaf, path=path)
        else:
            return _plain_value(path, leaf, wanted)
    array = _fitted(path, leaf, wanted, pad_truncate)
    if wanted.kind == "python":
        if array.size != 1:
            raise ShapeMismatchError(
                f"Leaf {path!r}: the target asks for a Python {wanted.python_type.__name__}, but "
                f"the checkpoint holds an array of shape {array.shape}. Make the target leaf an "
                f"array (np.ndarray, a jax.ShapeDtypeStruct), or suture.PLACEHOLDER to skip it."
            )
        return wanted.python_type(array.item())
    if wanted.kind == "stored" and leaf.stored_as == "scalar":
        return array.item()
    if wanted.kind == "jax" and not _saved_as_numpy(leaf, wanted):
        narrow = _jax_dtype(array.dtype)
        if narrow != array.dtype:  # 64-bit, and jax's 64-bit mode is off
            if wanted.numpy_if_saved_as_numpy and array.dtype == leaf.dtype:
                return array.read()  # as stored (suture.placeholders): jax would narrow it
            array = _narrowed(path, array, narrow)
        sharding = _concrete(_sharding(path, leaf, wanted), mesh, path)
        _check_divides(path, array.shape, sharding)
        return _to_jax(array, sharding)
    return array.read()


def _saved_as_numpy(leaf: LazyArray, wanted: LeafTarget) -> bool:
    return wanted.numpy_if_saved_as_numpy and leaf.stored_as in ("np.ndarray", "scalar")


def _jax_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype jax holds `dtype` in: int64 as int32 (and so on) while 64-bit mode is off."""
    import jax  # heavy: loaded on first use, not at import

    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _narrowed(path: str, array: LazyArray, narrow: np.dtype) -> LazyArray:
    """`array` in `narrow`, as jax holds it with 64-bit mode off, lazily, as jax and Orbax
    load it: floats rounded, but a block where that changes an integer (2**40 + 5 to int32
    is 5) or takes a finite float past the range (1e300 to inf) is an error."""
    wide = array.dtype

    def as_jax_holds_it(values: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):  # an overflow is refused below
            result = values.astype(narrow)
        changed = cast_changes(values, result)  # floats may round, as jax and Orbax round them
        if changed.any():
            where = np.flatnonzero(changed.reshape(-1))[0]
            stored, held = values.reshape(-1)[where].item(), result.reshape(-1)[where].item()
            raise UnsupportedError(
                f"Leaf {path!r} is {wide.name}, which jax holds only in 64-bit mode; with it "
                f"off (the default) jax holds it as {narrow.name}, which changes {stored!r} to "
                f'{held!r}. Turn it on before loading (jax.config.update("jax_enable_x64", '
                f"True)), or target np.ndarray for this leaf to keep the stored values on the host."
            )
        return result

    as_jax_holds_it.__name__ = f"as_jax_holds_{wide.name}"
    return lazy_map(as_jax_holds_it, array, shape=array.shape, dtype=narrow, elementwise=True)


def _check_divides(path: str, shape: tuple[int, ...], sharding: Any) -> None:
    """Refuses a sharding that splits an axis of `shape` into unequal parts, as jax does."""
    if sharding is None:
        return
    try:
        sharding.shard_shape(shape)
    except ValueError as error:  # jax's IndivisibleError
        spec = getattr(sharding, "spec", None)
        mesh = getattr(sharding, "mesh", None)
        where = ""
        for axis, entry in enumerate(tuple(spec or ())[: len(shape)]):
            names = (entry,) if isinstance(entry, str) else tuple(entry or ())
            ways = math.prod(mesh.shape[name] for name in names) if mesh is not None else 1
            if names and shape[axis] % ways:
                where = (
                    f": axis {axis} (size {shape[axis]}) would be split {ways} ways over mesh "
                    f"axis {' x '.join(map(repr, names))}"
                )
                break
        raise ShapeMismatchError(
            f"Leaf {path!r} of shape {shape} cannot be laid out as the target's sharding "
            f"{spec if spec is not None else sharding} asks{where}, which does not divide it. "
            f"Shard that axis over mesh axes whose sizes divide it (or not at all: None in the "
            f"PartitionSpec), or pad the target's shape to a multiple (pad_truncate=True)."
        ) from error


def _sharding(path: str, leaf: LazyArray, wanted: LeafTarget) -> Any:
    """The target's sharding; with none, the one the checkpoint recorded (as Orbax does)."""
    if hasattr(wanted.sharding, "to_jax_sharding"):  # Orbax ShardingMetadata, from its metadata
        return metadata_sharding(wanted.sharding, path)
    if wanted.sharding is not None:
        return wanted.sharding
    lookup = getattr(getattr(leaf, "node", None), "recorded_sharding", None)
    if lookup is None or wanted.shape not in (None, leaf.shape):
        return None
    recorded = lookup()
    return None if recorded is None else recorded_sharding(recorded, path)


def _callers_mesh(mesh: Any) -> Any:
    jax = loaded_jax()
    if mesh is not None or jax is None:
        return mesh
    current = jax.sharding.get_mesh()
    return None if current is None or getattr(current, "empty", False) else current


def _concrete(sharding: Any, mesh: Any, path: str) -> Any:
    """`sharding` on a concrete mesh (`mesh`, or the one set with ``jax.set_mesh``)."""
    import jax  # heavy: loaded on first use, not at import

    if sharding is None or not isinstance(
        getattr(sharding, "mesh", None), jax.sharding.AbstractMesh
    ):
        return sharding
    concrete = mesh if mesh is not None else jax.sharding.get_mesh()
    if (
        concrete is None
        or getattr(concrete, "empty", False)
        or concrete.axis_names != sharding.mesh.axis_names
    ):
        raise ArgumentError(
            f"Leaf {path!r}: the target's sharding names mesh axes {sharding.mesh.axis_names} but "
            f"no concrete mesh with those axes is set. Load under `with jax.set_mesh(mesh):` or "
            f"pass mesh=."
        )
    return jax.sharding.NamedSharding(concrete, sharding.spec)


def _already_in_place(leaf: Any, wanted: LeafTarget) -> Any:
    """An in-memory jax.Array that already is what the target asks for (no copy is made)."""
    node = getattr(leaf, "node", None)
    array = node.array if isinstance(node, MemorySource) else leaf
    if not is_jax_array(array) or wanted.kind != "jax":
        return None
    if (wanted.shape is not None and tuple(array.shape) != wanted.shape) or (
        wanted.dtype is not None and array.dtype != wanted.dtype
    ):
        return None
    if wanted.sharding is not None and array.sharding != wanted.sharding:
        return None
    return array


def _plain_value(path: str, leaf: Any, wanted: LeafTarget) -> Any:
    if leaf is None:
        return None  # a masked (optax.MaskedNode) leaf: Orbax restores None for any target
    if wanted.kind in ("numpy", "jax") and wanted.shape is not None:
        raise ShapeMismatchError(
            f"Leaf {path!r} is stored as a {type(leaf).__name__} ({leaf!r:.40}), not an array, "
            f"but the target asks for an array of shape {wanted.shape}. Make the target leaf "
            f"a plain value, or suture.PLACEHOLDER to skip it."
        )
    return leaf


def _fitted(path: str, array: LazyArray, wanted: LeafTarget, pad_truncate: bool | str) -> LazyArray:
    if wanted.shape is not None and any(size < 0 for size in wanted.shape):
        raise ShapeMismatchError(
            f"Leaf {path!r}: the target wants shape {wanted.shape}, which has a negative size; "
            f"no array can. Give the target the sizes it should have (the checkpoint has "
            f"{array.shape})."
        )
    shape_applies = pad_truncate or not wanted.shape_needs_pad_truncate
    if wanted.shape is not None and wanted.shape != array.shape and shape_applies:
        if not pad_truncate:
            raise _shape_error(path, wanted.shape, array.shape)
        array = fit_shape(array, wanted.shape, "mean" if pad_truncate == "mean" else "zeros")
    if wanted.dtype is not None:
        array = array.astype(wanted.dtype)
    return array


def _shape_error(path: str, wanted: tuple[int, ...], stored: tuple[int, ...]) -> ShapeMismatchError:
    return ShapeMismatchError(
        f"Leaf {path!r}: the target wants shape {wanted}, the checkpoint has {stored}. Pass "
        f"pad_truncate=True to zero-pad or truncate each axis, or fix the target's shape."
    )


def _to_jax(array: LazyArray, sharding: Any) -> Any:
    """A jax.Array; with a sharding, each process reads only what its devices hold.

    When this process's shards tile one box (the usual case: a process's devices are
    neighbours in the mesh), the box is read once and cut into shards, so a stored chunk
    that several local devices need is decoded once; otherwise each distinct shard is read
    on its own (replicated devices share one read). The shards of a tensor of a local
    file (safetensors) are each read into a buffer of its own, cast as it is read, which
    jax keeps as the device's without a copy (`staging`).
    """
    import jax  # heavy: loaded on first use, not at import

    if sharding is None:
        return jax.device_put(array.read())
    if array.ndim == 0:
        return jax.make_array_from_callback((), sharding, lambda _: array.read())
    indices = sharding.addressable_devices_indices_map(array.shape).values()
    ranges = {_ranges(index, array.shape) for index in indices}
    box = tuple(
        (min(r[axis][0] for r in ranges), max(r[axis][1] for r in ranges))
        for axis in range(array.ndim)
    )
    file = reads_a_file(array)
    if not (file and whole_rows(array.shape, ranges)) and math.prod(
        stop - start for start, stop in box
    ) <= sum(math.prod(stop - start for start, stop in r) for r in ranges):
        if file:  # each shard in a buffer of its own, jax's without a copy
            buffers = read_in_strips(array, ranges, box)
            return jax.make_array_from_callback(
                array.shape, sharding, lambda index: buffers[_ranges(index, array.shape)]
            )
        values = array[tuple(slice(start, stop) for start, stop in box)].read()

        def cut(index: tuple) -> np.ndarray:
            return values[
                tuple(
                    slice(start - low, stop - low)
                    for (start, stop), (low, _) in zip(
                        _ranges(index, array.shape), box, strict=True
                    )
                )
            ]

        return jax.make_array_from_callback(array.shape, sharding, cut)
    shards: dict[tuple, np.ndarray] = {}  # each read into a buffer of its own: the device's
    lock = threading.Lock()

    def read_shard(index: tuple) -> np.ndarray:
        key = _ranges(index, array.shape)
        with lock:  # replicated devices ask for the same slice: read it once
            if key not in shards:
                shards[key] = array[index].read()
            return shards[key]

    return jax.make_array_from_callback(array.shape, sharding, read_shard)


def _ranges(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """A shard's index (slices, perhaps open-ended) as ``(start, stop)`` on every axis."""
    padded = tuple(index) + (slice(None),) * (len(shape) - len(index))
    return tuple(entry.indices(length)[:2] for entry, length in zip(padded, shape, strict=True))


def _reshard(
    path: str, array: Any, wanted: LeafTarget, pad_truncate: bool | str, sharding: Any
) -> Any:
    """A jax.Array spread over several processes, fitted to the target by jax itself.

    No process can read it whole, so it is cast, padded or truncated under ``jax.jit`` and
    moved to the target's sharding with collectives.
    """
    import jax  # heavy: loaded on first use, not at import
    import jax.numpy as jnp  # heavy: loaded on first use, not at import

    if wanted.kind == "stored":
        return array
    if wanted.kind != "jax":
        raise UnsupportedError(
            f"Leaf {path!r} is a jax.Array sharded across processes, which no single process "
            f"can hold as a {'number' if wanted.kind == 'python' else 'numpy array'}. Target "
            f"a jax.ShapeDtypeStruct with a sharding, or gather it first "
            f"(jax.experimental.multihost_utils.process_allgather)."
        )
    shape = tuple(array.shape) if wanted.shape is None else wanted.shape
    if shape != tuple(array.shape) and not pad_truncate:
        raise _shape_error(path, shape, tuple(array.shape))
    if shape != tuple(array.shape) and pad_truncate == "mean":
        raise UnsupportedError(
            f"Leaf {path!r} is a jax.Array sharded across processes: it is padded with zeros "
            f"only (pad_truncate=True), not with the mean of its rows."
        )
    dtype = array.dtype if wanted.dtype is None else wanted.dtype
    target = sharding if sharding is not None else array.sharding
    _check_divides(path, shape, target)
    if shape == tuple(array.shape) and dtype == array.dtype:
        return jax.device_put(array, target)
    kept = tuple(slice(0, min(old, new)) for old, new in zip(array.shape, shape, strict=True))
    padding = [(0, max(0, new - old)) for old, new in zip(array.shape, shape, strict=True)]
    fit = jax.jit(lambda x: jnp.pad(x[kept], padding).astype(dtype), out_shardings=target)
    return fit(array)


def load_and_transform(
    transform: Any,
    *sources: Any,
    target: Any = None,
    init: Any = None,
    partial: bool = False,
    as_jax: bool = False,
    seed: Any = 0,
    strict_casts: bool = False,
) -> Any:
    """`suture.load` of `suture.transform`: the surgery's result in memory.

    Only the source leaves that the result uses are read. Arguments as in `transform`;
    `target` also chooses numpy or jax arrays, dtypes and shardings, as in `suture.load`.

    Example:
        >>> import numpy as np, suture
        >>> from suture import rules
        >>> suture.load_and_transform([rules.rename("old", "new")], {"old": np.arange(3)})
        {'new': array([0, 1, 2])}
    """
    result = lazy_transform(
        transform,
        *sources,
        target=target,
        init=init,
        partial=partial,
        seed=seed,
        strict_casts=strict_casts,
    )
    if is_transformations_tree(transform) and target is not None:
        target = placeholders_as_stored(target)
    return load(result, target, partial=partial, as_jax=as_jax)
