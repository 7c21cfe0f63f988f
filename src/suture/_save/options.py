"""`SaveOptions`: the keywords of `suture.save`, parsed and checked once, then passed inside.

Example:
    >>> options = SaveOptions.from_keywords(max_memory="256MiB")
    >>> options.max_memory, options.chunk_bytes
    (268435456, 16777216)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .._errors import ArgumentError
from .._exec.blocks import DEFAULT_MAX_MEMORY
from .._format import parse_bytes
from .._location import Location, location_of
from ..sinks.orbax import COMPRESSIONS, DEFAULT_CHUNK_BYTES, DEFAULT_COMPRESSION

FORMATS = ("orbax", "safetensors")


@dataclass(frozen=True, kw_only=True)
class SaveOptions:
    """How a save writes; each field is the `suture.save` keyword of the same name.

    `show_progress` is the decision `progress=None` leaves to the terminal, made once;
    `extra_files` are the side files as `Location`s.
    """

    format: str = "orbax"
    overwrite: bool = False
    separator: str = "."
    metadata: dict[str, Any] | None = None
    max_memory: int = DEFAULT_MAX_MEMORY
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    max_shard_size: int | None = None
    show_progress: bool = False
    shard_map: dict[str, str] | None = None
    extra_files: Mapping[str, Location] = field(default_factory=dict)
    verify: bool = False
    tune_allocator: bool | None = None  # None: as SUTURE_TUNE_ALLOCATOR says
    compression: str = DEFAULT_COMPRESSION
    # {leaf path: shard shape} on the target mesh (`target_sharding`): chunks tile them
    shards: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @classmethod
    def from_keywords(
        cls,
        *,
        format: str = "orbax",  # noqa: A002 (the public word for it)
        overwrite: bool = False,
        separator: str = ".",
        metadata: dict[str, Any] | None = None,
        max_memory: int | str | None = None,
        chunk_bytes: int | str | None = None,
        max_shard_size: int | str | None = None,
        show_progress: bool = False,
        shard_map: dict[str, str] | None = None,
        extra_files: Mapping[str, Any] | None = None,
        verify: bool = False,
        tune_allocator: bool | None = None,
        compression: str = DEFAULT_COMPRESSION,
    ) -> SaveOptions:
        """Options from the public keywords: sizes such as ``"4GiB"`` parsed, defaults set.

        Without `chunk_bytes`, small budgets get small chunks, so that a block fits them.
        """
        if format not in FORMATS:
            raise ArgumentError(
                f"Unknown output format {format!r}: use one of {', '.join(FORMATS)}."
            )
        if compression not in COMPRESSIONS:
            raise ArgumentError(
                f"Unknown compression {compression!r}: use one of {', '.join(COMPRESSIONS)} "
                f"({DEFAULT_COMPRESSION} is the default; zstd is Orbax's own; none writes chunks as "
                f"they are)."
            )
        if compression != DEFAULT_COMPRESSION and format != "orbax":
            raise ArgumentError(
                f"compression={compression!r} applies to Orbax output only; {format} files "
                f"are not compressed. Leave it out, or write format='orbax'."
            )
        budget = parse_bytes(max_memory) if max_memory is not None else DEFAULT_MAX_MEMORY
        chunk = parse_bytes(chunk_bytes) if chunk_bytes is not None else default_chunk_bytes(budget)
        return cls(
            format=format,
            overwrite=overwrite,
            separator=separator,
            metadata=metadata,
            max_memory=budget,
            chunk_bytes=chunk,
            max_shard_size=parse_bytes(max_shard_size) if max_shard_size is not None else None,
            show_progress=show_progress,
            shard_map=shard_map,
            extra_files={name: location_of(file) for name, file in (extra_files or {}).items()},
            verify=verify,
            tune_allocator=tune_allocator,
            compression=compression,
        )

    def under_budget(self, max_memory: int) -> SaveOptions:
        """These options with another `max_memory`, and the chunks that budget gets by default
        (unless `chunk_bytes` was chosen)."""
        chosen = self.chunk_bytes != default_chunk_bytes(self.max_memory)
        chunk = self.chunk_bytes if chosen else default_chunk_bytes(max_memory)
        return replace(self, max_memory=max_memory, chunk_bytes=chunk)


def default_chunk_bytes(max_memory: int) -> int:
    """Orbax chunks for a budget: 16 MiB, or a sixteenth of a smaller budget, so a block fits."""
    return max(1 << 16, min(DEFAULT_CHUNK_BYTES, max_memory // 16))
