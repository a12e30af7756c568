"""Writing a file so that a crash leaves either the old file or the whole new one, never a part."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, then rename it over `path` (atomic
    on POSIX). The flush before the rename is what makes this hold after a power loss or an OS crash too,
    not only after the process is killed: otherwise the rename can reach the disk before the data, and
    the entry comes back empty. Creates the parent directory; the temporary file is removed if anything
    fails."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
