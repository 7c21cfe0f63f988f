"""Names a sink writes must read back as the same leaves: checked before anything is written.

Every sink refuses names that its format, or suture reading it back, cannot keep apart or
hold: empty names, text that is not UTF-8 (TensorStore and the safetensors header need it),
names longer than the format's keys allow, and two leaves that would share one stored name.

Example:
    >>> names = OrbaxNames()
    >>> names.add(("params", "w"))
    'params.w'
    >>> check_safetensors_name("model.embed.weight")
"""

from __future__ import annotations

from .._errors import ArgumentError, PathConflictError, UnsupportedError

# OCDBT keys hold at most 65,535 bytes; an array's chunk keys add its name a suffix.
MAX_ORBAX_NAME_BYTES = 60_000
RESERVED_SAFETENSORS_NAMES = ("__metadata__",)


def _check_text(name: str, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise UnsupportedError(
            f"{what} {name!r} is empty: a reader could not address it (suture reads an empty "
            f"name as the whole tree). Rename it (rules.rename)."
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsupportedError(
            f"{what} {name[:200]!r} is not valid Unicode (it holds undecodable bytes, e.g. from "
            f"a file name); the format stores UTF-8. Rename it (rules.rename)."
        ) from None


def check_safetensors_name(name: str) -> None:
    """Refuses a tensor name that a safetensors header cannot hold as a tensor."""
    _check_text(name, "Tensor name")
    if name in RESERVED_SAFETENSORS_NAMES:
        raise UnsupportedError(
            f"Tensor name {name!r} is reserved by safetensors for the file's metadata. Rename "
            f"it (rules.rename)."
        )


def check_shard_file_name(filename: str) -> None:
    """A shard of a sharded safetensors output: a plain ``*.safetensors`` file in the folder."""
    _check_text(filename, "Shard file name")
    if (
        "/" in filename
        or "\\" in filename
        or filename.startswith(".")
        or not filename.endswith(".safetensors")
        or "\0" in filename
    ):
        raise ArgumentError(
            f"Shard file name {filename[:200]!r} must be a plain file name ending in "
            f".safetensors (no folders, not hidden), e.g. 'model-00001-of-00002.safetensors'."
        )


class OrbaxNames:
    """The stored names (keys joined by '.', as Orbax does) of one checkpoint, kept unique."""

    def __init__(self) -> None:
        self._taken: dict[str, tuple[str, ...]] = {}

    def add(self, keys: tuple[str, ...]) -> str:
        """The stored name of `keys`; a SurgeryError if it is unusable or already taken."""
        path = "/".join(keys)
        name = ".".join(keys)
        _check_text(name, f"Leaf {path[:200]!r}: its stored name")
        if len(name.encode("utf-8")) > MAX_ORBAX_NAME_BYTES:
            raise UnsupportedError(
                f"Leaf {path[:80]!r}...: its stored name has {len(name.encode('utf-8')):,} bytes; "
                f"an Orbax (OCDBT) key holds at most {MAX_ORBAX_NAME_BYTES:,}. Rename it "
                f"(rules.rename), or write safetensors."
            )
        if name in self._taken:
            raise PathConflictError(
                f"Leaves {'/'.join(self._taken[name])!r} and {path!r} would both be stored as "
                f"{name!r} (Orbax joins keys with '.'). Rename one (rules.rename)."
            )
        self._taken[name] = keys
        return name
