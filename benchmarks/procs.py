"""Which processes a run started and left behind, read from /proc (Linux only).

The reliability benchmark and the launch tests ask the same two questions — which children does a
process have, and which of some processes still run — so they share these helpers. Multiprocessing's
resource tracker is never counted: it lives as long as the process that started it, by design. Nor
is its fork server, which freezeopt starts its ranks from: it too lives as long as its starter,
and its children (the ranks) count as the starter's own.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

__all__ = ["alive", "children"]


def _stat(pid: int | str) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state first, then the parent's pid)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def children(pid: int, *, zombies: bool = False, _server: bool = True) -> set[int]:
    """Direct children of `pid` (those of its fork server among them); zombies (ended, not yet
    reaped) only when `zombies`. A process forked by the fork server keeps the server's command
    line, so only a direct child of `pid` is taken for the server (`_server`)."""
    out = set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        fields = _stat(d.name)
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if fields is None or int(fields[1]) != pid or b"resource_tracker" in cmd:
            continue
        if _server and b"multiprocessing.forkserver" in cmd:
            out |= children(int(d.name), zombies=zombies, _server=False)
        elif zombies or fields[0] != "Z":
            out.add(int(d.name))
    return out


def alive(pids: Iterable[int]) -> set[int]:
    """Those of `pids` that still run (exist and are not zombies)."""
    out = set()
    for p in pids:
        fields = _stat(p)
        if fields is not None and fields[0] != "Z":
            out.add(p)
    return out
