"""Where the pytree items of an Orbax checkpoint are, for every layout Orbax writes.

Layouts understood:

- a pytree item folder, holding ``_METADATA`` (v0 ``StandardCheckpointer`` /
  ``PyTreeCheckpointer`` save folders, and items inside steps);
- a checkpoint folder holding item folders (v1 ``ocp.save`` puts the tree in ``state/``
  or ``pytree/``; a CheckpointManager step holds ``default/`` or named items). A lone item
  under one of those default names is the whole tree, as Orbax restores it; otherwise
  every item is a subtree under its name, as a ``Composite`` restore names them, and JSON
  items (``JsonSave``) are subtrees of their JSON values;
- a CheckpointManager root holding step folders (``1/``, ``2/`` or ``prefix_3/``): the
  newest finished step, or the one asked for.

A folder whose name carries ``.orbax-checkpoint-tmp`` is a save that never finished, as
is one whose ``_CHECKPOINT_METADATA`` has no commit time, and (as stock Orbax decides on
GCS) a ``gs://`` checkpoint without ``commit_success.txt``.

Remote folders are read the same way through `suture._location`: known names first
(``_METADATA``, ``_CHECKPOINT_METADATA``), listing only for item and step folders.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field

from .._errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NotACheckpointError,
    SurgeryError,
    UnfinishedCheckpointError,
)
from .._hf import SideFileWarning, local_side_file
from .._json import loads as loads_json
from .._location import MAX_METADATA_BYTES, LocalLocation, Location, RemoteLocation
from .._location.publish import COMMIT_SUCCESS_FILE

TMP_MARKER = ".orbax-checkpoint-tmp"
PYTREE_METADATA = "_METADATA"
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
DEFAULT_ITEM_NAMES = ("default", "state", "pytree")  # CheckpointManager's and v1's
JSON_ITEM_FILE = "metadata"  # the file JsonCheckpointHandler writes
V1_MARKER = "orbax.checkpoint"  # the file v1 writes into a checkpoint folder
_STEP_NAME = re.compile(r"^(?:(?P<prefix>.*)_)?(?P<step>\d+)$")


@dataclass(frozen=True)
class OrbaxLayout:
    """The pytree items to read: ``{item name: folder}`` (name None for a lone item).

    `json_items` holds the values of JSON items, by item name.
    """

    items: dict[str | None, Location]
    step: int | None
    custom_metadata: dict
    json_items: dict[str, object] = field(default_factory=dict)


def is_orbax_folder(path: Location) -> bool:
    """True when `path` looks like any Orbax layout (cheap: a few stat calls or reads)."""
    if (path / PYTREE_METADATA).is_file() or (path / CHECKPOINT_METADATA).is_file():
        return True
    if _cannot_list(path) or not path.is_dir():
        return False
    return bool(_steps_of(path))


def no_step_is_a_checkpoint(path: Location) -> bool:
    """Whether none of `path`'s subfolders named like steps (``1``, ``run_2``) holds an
    Orbax checkpoint (its metadata, or an item's)."""
    return not any(
        (step / CHECKPOINT_METADATA).is_file()
        or (step / PYTREE_METADATA).is_file()
        or any((step / item / PYTREE_METADATA).is_file() for item in step.subfolders())
        for step in _steps_of(path).values()
    )


def _cannot_list(path: Location) -> bool:
    return isinstance(path, RemoteLocation) and path.scheme in ("http", "https")


def resolve(path: Location, step: int | None = None) -> OrbaxLayout:
    """Finds the pytree items under `path`.

    Raises:
        CheckpointNotFoundError: `path` does not exist.
        UnfinishedCheckpointError: the save at `path` never completed.
        NotACheckpointError: `path` is empty or holds no Orbax checkpoint.
    """
    recorded = _read_json_if_present(path / CHECKPOINT_METADATA)
    _refuse_unfinished(path, recorded)
    if (path / PYTREE_METADATA).is_file():
        if step is not None:
            raise NotACheckpointError(
                f"{str(path)!r} is a single checkpoint, not a CheckpointManager folder, so "
                f"step={step} does not apply. Drop step=, or pass the folder that holds the steps."
            )
        return OrbaxLayout({None: path}, None, _custom_metadata(path, recorded))
    if not path.exists():
        raise CheckpointNotFoundError(f"No such file or folder: {str(path)!r}. Check the path.")
    items = _items_of(path)
    if items:
        if step is not None:
            raise NotACheckpointError(
                f"{str(path)!r} is one checkpoint step, so step={step} does not apply. Pass "
                f"the CheckpointManager folder above it, or drop step=."
            )
        json_items = {} if list(items) == [None] else _json_items_of(path)
        return OrbaxLayout(items, _step_of(path), _custom_metadata(path, recorded), json_items)
    steps = {} if _cannot_list(path) else _steps_of(path)
    if steps:
        return _resolve_step(path, steps, step)
    _explain_not_a_checkpoint(path)
    raise AssertionError("unreachable")


def _refuse_unfinished(path: Location, recorded: object = None) -> None:
    """Refuses an unfinished save; `recorded`: its ``_CHECKPOINT_METADATA`` if read already
    (`_ABSENT`: there is none)."""
    if TMP_MARKER in path.name:
        raise UnfinishedCheckpointError(
            f"{str(path)!r} is an unfinished Orbax save (its name carries {TMP_MARKER!r}): the "
            f"process writing it stopped before the commit. Use a finished checkpoint; this "
            f"folder can be deleted."
        )
    if recorded is None:
        recorded = _read_json_if_present(path / CHECKPOINT_METADATA)
    if recorded is not _ABSENT:
        if (
            isinstance(recorded, dict)
            and recorded.get("commit_timestamp_nsecs") is None
            and ("init_timestamp_nsecs" in recorded)
        ):
            raise UnfinishedCheckpointError(
                f"{str(path)!r} is an unfinished Orbax save: {CHECKPOINT_METADATA} records a "
                f"start but no commit. Use a finished checkpoint."
            )
        if (
            isinstance(path, RemoteLocation)
            and path.scheme == "gs"
            and not (path / COMMIT_SUCCESS_FILE).is_file()
        ):
            raise UnfinishedCheckpointError(
                f"{str(path)!r} is an unfinished Orbax save: on GCS a checkpoint is finished "
                f"when {COMMIT_SUCCESS_FILE} is written, and it is missing (stock Orbax refuses "
                f"it too). Use a finished checkpoint, or wait for the save."
            )


def _items_of(path: Location) -> dict[str | None, Location]:
    if _cannot_list(path) or not path.is_dir():
        return {}
    items: dict[str | None, Location] = {}
    for name in path.subfolders():
        child = path / name
        if TMP_MARKER not in name and (child / PYTREE_METADATA).is_file():
            items[name] = child
    if len(items) == 1:
        name, folder = next(iter(items.items()))
        if _is_the_whole_tree(path, name):
            return {None: folder}
    return items


def _is_the_whole_tree(path: Location, name: str) -> bool:
    """Whether Orbax restores the lone item `name` as the tree itself, not under its name.

    A CheckpointManager's single ``default`` item is; so is v1's ``state`` (or ``pytree``)
    when v1 wrote the step alone. A v0 ``Composite`` with one item named ``state`` is
    restored under its name.
    """
    if name == "default":
        return True
    if name not in DEFAULT_ITEM_NAMES or _json_items_of(path):
        return False
    recorded = (
        _read_json(path / CHECKPOINT_METADATA) if (path / CHECKPOINT_METADATA).is_file() else {}
    )
    handlers = recorded.get("item_handlers") if isinstance(recorded, dict) else None
    handler = handlers.get(name) if isinstance(handlers, dict) else None
    written_by_v1 = (path / V1_MARKER).is_file() or ".v1." in str(handler)
    return handler is None or written_by_v1


def _json_items_of(path: Location) -> dict[str, object]:
    """The values of the JSON items in a step (``ocp.args.JsonSave``), by item name."""
    if _cannot_list(path):
        return {}
    values = {}
    for name in path.subfolders():
        child = path / name
        if TMP_MARKER not in name and (child / JSON_ITEM_FILE).is_file():
            values[name] = _read_json(child / JSON_ITEM_FILE)
    return values


def _steps_of(path: Location) -> dict[int, Location]:
    steps: dict[int, Location] = {}
    for name in path.subfolders():
        match = _STEP_NAME.match(name)
        if match and TMP_MARKER not in name:
            steps[int(match.group("step"))] = path / name
    return steps


def _step_of(path: Location) -> int | None:
    match = _STEP_NAME.match(path.name)
    return int(match.group("step")) if match else None


def _resolve_step(root: Location, steps: dict[int, Location], step: int | None) -> OrbaxLayout:
    if step is None:
        chosen = _newest_finished(steps)
    elif step in steps:
        chosen = step
    else:
        raise NotACheckpointError(
            f"{str(root)!r} has no step {step}. Steps found: {_list_steps(steps)}. Pass one "
            f"of them as step=, or leave step= out for the newest."
        )
    layout = resolve(steps[chosen])
    return OrbaxLayout(layout.items, chosen, layout.custom_metadata, layout.json_items)


def _newest_finished(steps: dict[int, Location]) -> int:
    """The newest step whose save completed; a newer unfinished one is passed over.

    Orbax lists every step whose folder was renamed into place; suture also passes over one
    whose ``_CHECKPOINT_METADATA`` records a start but no commit (a save that stopped).
    """
    for candidate in sorted(steps, reverse=True):
        try:
            _refuse_unfinished(steps[candidate])
        except UnfinishedCheckpointError:
            continue
        return candidate
    _refuse_unfinished(steps[max(steps)])  # none finished: explain the newest
    raise AssertionError("unreachable")


def _list_steps(steps: dict[int, Location]) -> str:
    ordered = sorted(steps)
    shown = ", ".join(str(s) for s in ordered[:10])
    return shown + (f" ... ({len(ordered)} in all)" if len(ordered) > 10 else "")


def _explain_not_a_checkpoint(path: Location) -> None:
    if _cannot_list(path):
        raise NotACheckpointError(
            f"{str(path)!r} holds no Orbax {PYTREE_METADATA} or {CHECKPOINT_METADATA}, and an "
            f"HTTP server cannot list a folder to find item or step folders. Pass the folder "
            f"that holds {PYTREE_METADATA}."
        )
    if not path.is_dir():
        raise NotACheckpointError(
            f"{str(path)!r} is a file that suture cannot read as a checkpoint. suture reads "
            f"Orbax checkpoint folders."
        )
    entries = path.children()
    if not entries:
        raise NotACheckpointError(f"{str(path)!r} is an empty folder, not a checkpoint.")
    unfinished = [name for name in entries if TMP_MARKER in name]
    if unfinished:
        raise UnfinishedCheckpointError(
            f"{str(path)!r} holds only unfinished Orbax saves ({', '.join(unfinished[:3])}): "
            f"their writers stopped before the commit. Wait for the save, or use a finished one."
        )
    shown = ", ".join(entries[:8]) + (" ..." if len(entries) > 8 else "")
    raise NotACheckpointError(
        f"{str(path)!r} is not a checkpoint: found {shown}, but no Orbax {PYTREE_METADATA} "
        f"file, item folder or step folder. Pass the checkpoint folder itself."
    )


def _custom_metadata(path: Location, recorded: object) -> dict:
    """The custom metadata in `recorded` (`path`'s ``_CHECKPOINT_METADATA``, read already),
    or else in the step's parent's; none from a file that is not the checkpoint's own."""
    for folder, candidate in ((path, recorded), (path.parent, None)):
        if candidate is None:
            candidate = _read_json_if_present(folder / CHECKPOINT_METADATA)
        if isinstance(candidate, dict) and isinstance(candidate.get("custom_metadata"), dict):
            return candidate["custom_metadata"] if _own_file(folder, CHECKPOINT_METADATA) else {}
    return {}


def _own_file(folder: Location, name: str) -> bool:
    """Whether a local `folder`'s `name` is a regular file inside it (the side-file rule),
    else a warning: what a conversion recorded there (a model's config, written back out
    as config.json) is not taken from a file linked from elsewhere."""
    if not isinstance(folder, LocalLocation):
        return True
    found = local_side_file(folder.path, name)
    if isinstance(found, str):
        warnings.warn(
            f"Not reading the custom metadata of {str(folder / name)!r}: {found}. suture takes "
            f"what a conversion recorded (the model's config) only from the checkpoint's own "
            f"files; pass --config, or --like the original Hugging Face folder.",
            SideFileWarning,
            stacklevel=4,
        )
        return False
    return True


_ABSENT = object()  # a file that is not there


def _read_json_if_present(path: Location) -> object:
    """The JSON in `path`, or `_ABSENT` (one read where an existence probe and a read took
    two round trips on an object store)."""
    if not path.is_remote:
        return _read_json(path) if path.is_file() else _ABSENT
    try:
        data = path.read_bytes(MAX_METADATA_BYTES)
    except CheckpointNotFoundError:
        return _ABSENT
    try:
        return loads_json(data)
    except ValueError as error:
        raise _unreadable(path, error) from error


def _read_json(path: Location) -> object:
    try:
        return loads_json(path.read_bytes(MAX_METADATA_BYTES))
    except SurgeryError as error:
        if not isinstance(error, CheckpointNotFoundError):
            raise  # already says what is wrong (too large, no answer, changed)
        raise _unreadable(path, error) from error
    except (OSError, ValueError) as error:
        raise _unreadable(path, error) from error


def _unreadable(path: Location, error: BaseException) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"Cannot read {str(path)!r} as JSON ({error}). The checkpoint is damaged; "
        f"restore it from a copy."
    )
