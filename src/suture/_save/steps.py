"""A step of a CheckpointManager run: ``suture.save(tree, run, step=N, item="model")``.

Orbax's CheckpointManager keeps step ``N`` of a run in ``run/N/``, one folder per item
(``default`` without ``item_names``). A new step is written beside the others under a
temporary name that readers skip (Orbax's ``.orbax-checkpoint-tmp`` marker), then renamed
into place, so a manager never sees it half written; an item added to an existing step is
published as every save is. The run folder is created if it is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._errors import (
    ArgumentError,
    DestinationError,
    DestinationExistsError,
    UnsupportedError,
)
from .._json import loads as loads_json
from .._location import LocalLocation, location_of
from .._location.publish import unwritable
from ..sources.orbax_layout import CHECKPOINT_METADATA, TMP_MARKER

DEFAULT_ITEM = "default"  # a CheckpointManager's item without item_names
_HANDLER = "orbax.checkpoint._src.handlers.standard_checkpoint_handler.StandardCheckpointHandler"


def save_step(
    run: Any, step: int | None, item: str | None, overwrite: bool, write: Callable[[Any], Any]
) -> Any:
    """Writes one item of step `step` of the run at `run` with ``write(item_folder)``."""
    if step is None or isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ArgumentError(
            f"step={step!r}: a CheckpointManager step is a number (0 or more); item= goes with "
            f"step=. To write a single checkpoint, leave both out."
        )
    name = DEFAULT_ITEM if item is None else item
    if not name or "/" in name or name.startswith(".") or name in ("..",):
        raise ArgumentError(f"item={item!r} must be a plain folder name, such as 'model'.")
    where = location_of(run)
    if not isinstance(where, LocalLocation):
        raise UnsupportedError(
            f"step= writes a CheckpointManager step to a local or mounted folder; "
            f"{str(where)!r} is remote. Write to the step's item folder itself "
            f"({str(where)}/{step}/{name})."
        )
    root = where.path
    if root.exists() and not root.is_dir():
        raise ArgumentError(f"{str(root)!r} is a file, not a CheckpointManager run folder.")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise unwritable(LocalLocation(root), error) from None
    step_dir = root / str(step)
    if step_dir.exists():
        if (step_dir / name).exists() and not overwrite:
            raise DestinationExistsError(
                f"Step {step} of {str(root)!r} already has an item {name!r}. Pass overwrite=True "
                f"(--overwrite) to replace it, or write another step."
            )
        result = write(step_dir / name)
        _record_item(step_dir, name)
        return result
    temporary = root / f"{step}{TMP_MARKER}-suture-{uuid.uuid4().hex[:12]}"
    try:
        temporary.mkdir()
    except OSError as error:
        raise unwritable(LocalLocation(temporary), error) from None
    try:
        result = write(temporary / name)
        _record_item(temporary, name)
        try:
            os.rename(temporary, step_dir)
        except OSError as error:  # another writer made the step meanwhile
            raise DestinationError(
                f"Step {step} of {str(root)!r} appeared while this save wrote it "
                f"({error.strerror}); nothing was changed. Write its item again."
            ) from None
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return result


def _record_item(step_dir: Path, name: str) -> None:
    """The step's ``_CHECKPOINT_METADATA``, as a CheckpointManager writes it, with `name`."""
    file = step_dir / CHECKPOINT_METADATA
    try:
        recorded = loads_json(file.read_text()) if file.is_file() else {}
    except (OSError, ValueError):
        recorded = {}
    if not isinstance(recorded, dict):
        recorded = {}
    now = time.time_ns()
    recorded.setdefault("item_handlers", {})
    if isinstance(recorded["item_handlers"], dict):
        recorded["item_handlers"][name] = _HANDLER
    recorded.setdefault("metrics", {})
    recorded.setdefault("performance_metrics", {})
    recorded.setdefault("init_timestamp_nsecs", now)
    recorded["commit_timestamp_nsecs"] = now
    recorded.setdefault("custom_metadata", {})
    scratch = step_dir / f".{CHECKPOINT_METADATA}.{uuid.uuid4().hex[:8]}"
    scratch.write_text(json.dumps(recorded))
    os.replace(scratch, file)
