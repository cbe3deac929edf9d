"""File and stream helpers at the edges: atomic writes (a reader sees the old file or the new one,
never half of either) and keeping native libraries' chatter off stdout."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from freezeopt.errors import FreezeoptError

__all__ = ["atomic_write_bytes", "atomic_write_text", "stdout_to_stderr"]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise FreezeoptError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise FreezeoptError(
            f"cannot write {path}: {e.strerror or e}; the previous file is unchanged"
        ) from None


def atomic_write_text(path: Path, text: str) -> None:
    """Write text (UTF-8) atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr for the duration (HiGHS prints a banner there even with
    msg=False); stdout stays for data. A no-op where stdout or stderr has no file descriptor."""
    try:
        out_fd, err_fd = sys.stdout.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stdout.flush()
    saved = os.dup(out_fd)
    try:
        os.dup2(err_fd, out_fd)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, out_fd)
        os.close(saved)
