"""Where a zip entry's bytes lie in its archive: read from the entry's own local header, and
bounded by the next entry (what numpy's npz and PyTorch's zip readers both need to check a
member stored uncompressed, or to read it in place)."""

from __future__ import annotations

import zipfile
from typing import Any


def data_ends(archive: zipfile.ZipFile) -> dict[int, int]:
    """Where each entry's data must end, by its header offset: at the next entry's header,
    or at the central directory after the last."""
    starts = sorted({info.header_offset for info in archive.infolist()})
    return dict(zip(starts, [*starts[1:], archive.start_dir], strict=True))


def data_start(raw: Any, info: zipfile.ZipInfo) -> int:
    """Where `info`'s data starts in the archive `raw` (a seekable binary file): after its
    local header, whose name and extra field may differ from the central directory's."""
    raw.seek(info.header_offset + 26)  # the local header's name and extra field lengths
    lengths = raw.read(4)
    name_length = int.from_bytes(lengths[:2], "little")
    return info.header_offset + 30 + name_length + int.from_bytes(lengths[2:], "little")
