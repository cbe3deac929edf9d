"""Training checkpoints: one file per rank per checkpoint, written atomically, a few kept.

Why this layout: in a pipeline every rank owns different model chunks, so each rank saves its own
state with `torch.save` (model chunks, optimizer, controller state, RNG) and nobody gathers
weights. A checkpoint is the folder `OUT/checkpoints/step-00000042/` holding `rank<r>.pt` for
every rank and `meta.json`, which rank 0 writes last, after every rank has renamed its file into
place: a folder without `meta.json` is incomplete (a crash mid-save) and is never resumed from.
`step` is the first step still to run, so resuming from `step-00000042` runs step 42 next. Every
file goes through a temporary file in the same folder and a rename, so a reader sees the old file
or the new one, never half of either; `keep` bounds how many complete checkpoints stay on disk.

Atomic writes do not protect a file after it is written (a bad disk, a copy cut short, a stray
edit), so `meta.json` also records the SHA-256 of every rank's file, hashed from disk after the
rename. `good_checkpoints` checks them and a resume or a rollback takes the newest checkpoint whose
files all match, naming the ones it skipped; a resume also reads each file of the one it takes
(`unreadable`) and falls back past one that does not load.

What is trusted: a checksum proves a file is the one written, not who wrote it (anyone who can
write the run folder can recompute it), so rank files are read weights-only (tensors and plain
data; torch refuses anything else), never by unpickling arbitrary objects, and `meta.json` is
plain JSON. Reading a checkpoint never runs code from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from freezeopt.errors import FreezeoptError, InputError, MismatchError, short
from freezeopt.fileio import atomic_write_text, give_usual_mode, read_text_file

__all__ = [
    "Checkpoint",
    "checkpoint_dir",
    "file_sha256",
    "find_checkpoints",
    "good_checkpoints",
    "latest_checkpoint",
    "load_rank_state",
    "prune_checkpoints",
    "resume_candidates",
    "save_rank_state",
    "unreadable",
    "verify_rank_file",
    "write_meta",
]

_PREFIX = "step-"
META = "meta.json"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A complete checkpoint on disk."""

    path: Path
    step: int
    """The first step still to run."""
    meta: dict[str, Any]


def checkpoint_dir(root: Path, step: int) -> Path:
    """The folder of the checkpoint taken before `step`."""
    return Path(root) / f"{_PREFIX}{step:08d}"


def save_rank_state(root: Path, step: int, rank: int, state: dict[str, Any]) -> tuple[Path, str]:
    """Write this rank's state of the checkpoint before `step` (atomically); returns the file and
    its SHA-256 (read back from disk), which `write_meta` records."""
    import torch

    folder = checkpoint_dir(root, step)
    target = folder / f"rank{rank}.pt"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".rank{rank}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise FreezeoptError(f"cannot write checkpoint {folder}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        give_usual_mode(tmp, target)
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise FreezeoptError(
            f"cannot write checkpoint {target}: {e.strerror or e}; free disk space or pass another --out-dir"
        ) from None
    try:
        digest = file_sha256(target)
    except OSError as e:
        raise FreezeoptError(f"cannot read back checkpoint {target}: {e.strerror or e}") from None
    return target, digest


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def verify_rank_file(ckpt: Checkpoint, rank: int) -> str | None:
    """None when rank `rank`'s file of `ckpt` matches the checksum in its meta.json, else why not."""
    sums = ckpt.meta.get("sha256")
    want = sums.get(str(rank)) if isinstance(sums, dict) else None
    f = ckpt.path / f"rank{rank}.pt"
    if not isinstance(want, str):
        return f"{ckpt.path / META} records no checksum for rank {rank}"
    try:
        got = file_sha256(f)
    except OSError as e:
        return f"cannot read {f}: {e.strerror or e}"
    if got != want:
        return f"{f} is corrupted (SHA-256 {got[:12]}…, {want[:12]}… recorded)"
    return None


def good_checkpoints(
    root: Path, ranks: range | list[int]
) -> tuple[list[Checkpoint], list[tuple[Checkpoint, str]]]:
    """Complete checkpoints whose files for `ranks` all match their checksums (oldest first), and
    the complete ones that do not, each with the reason (the first bad file)."""
    good: list[Checkpoint] = []
    bad: list[tuple[Checkpoint, str]] = []
    for c in find_checkpoints(root):
        why = next((w for r in ranks if (w := verify_rank_file(c, r)) is not None), None)
        if why is None:
            good.append(c)
        else:
            bad.append((c, why))
    return good, bad


def resume_candidates(
    root: Path, ranks: range | list[int]
) -> tuple[list[Checkpoint], list[tuple[Checkpoint, str]]]:
    """`good_checkpoints`, less the newest ones whose files match their checksums but do not
    load (each added to the bad ones with why): a resume takes the last good one."""
    good, bad = good_checkpoints(root, ranks)
    while good and (why := unreadable(good[-1], ranks)) is not None:
        bad.append((good.pop(), why))
    return good, bad


def write_meta(root: Path, step: int, meta: dict[str, Any], digests: dict[int, str]) -> Path:
    """Mark the checkpoint before `step` complete (call after every rank saved its state), with
    each rank's file checksum (`digests`: rank → SHA-256 from `save_rank_state`)."""
    folder = checkpoint_dir(root, step)
    doc = {**meta, "step": step, "sha256": {str(r): d for r, d in sorted(digests.items())}}
    atomic_write_text(folder / META, json.dumps(doc, indent=2, sort_keys=True))
    return folder


def load_rank_state(path: Path, rank: int) -> dict[str, Any]:
    """This rank's state from checkpoint folder `path`."""
    import torch

    f = Path(path) / f"rank{rank}.pt"
    try:
        with open(f, "rb") as fh:
            state = torch.load(fh, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(
            f"checkpoint {path} has no state for rank {rank}; it was written by a job with fewer ranks"
        ) from None
    except Exception as e:  # torch raises many kinds for a damaged or hostile file
        raise InputError(
            f"cannot read checkpoint {f} ({_first_line(e)}); delete the folder to resume from an "
            "older one"
        ) from None
    if not isinstance(state, dict):
        raise InputError(f"checkpoint {f} holds no rank state; delete the folder")
    return state


def unreadable(ckpt: Checkpoint, ranks: range | list[int]) -> str | None:
    """None when every rank's file of `ckpt` loads weights-only, else why the first does not
    (memory-mapped: nothing is copied into memory)."""
    import torch

    for r in ranks:
        f = ckpt.path / f"rank{r}.pt"
        try:
            state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except Exception as e:  # torch raises many kinds for a damaged or hostile file
            return f"{f} does not load weights-only ({_first_line(e)[:200]})"
        if not isinstance(state, dict):
            return f"{f} holds no rank state"
    return None


def find_checkpoints(root: Path) -> list[Checkpoint]:
    """Complete checkpoints under `root`, oldest first."""
    out: list[Checkpoint] = []
    root = Path(root)
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        if not (d.is_dir() and d.name.startswith(_PREFIX) and d.name[len(_PREFIX) :].isdigit()):
            continue
        try:
            text = read_text_file(d / META, what="checkpoint", limit=2**20, missing_hint="")
            meta = json.loads(text)
        except (InputError, RecursionError, ValueError):
            continue  # incomplete (a crash while saving), or not a meta.json freezeopt wrote
        if not isinstance(meta, dict):
            continue  # not freezeopt's: a meta.json that is no JSON object is not a checkpoint
        out.append(Checkpoint(path=d, step=int(d.name[len(_PREFIX) :]), meta=meta))
    return out


def latest_checkpoint(root: Path) -> Checkpoint | None:
    """The newest complete checkpoint under `root`, or None."""
    found = find_checkpoints(root)
    return found[-1] if found else None


def prune_checkpoints(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints, and incomplete ones older than those."""
    found = find_checkpoints(root)
    removed: list[Path] = []
    if keep < 1 or len(found) <= keep:
        doomed: list[Path] = []
    else:
        doomed = [c.path for c in found[:-keep]]
    newest = found[-1].step if found else -1
    complete = {c.path for c in found}
    for d in sorted(Path(root).iterdir()) if Path(root).is_dir() else []:
        if (
            d.is_dir()
            and d.name.startswith(_PREFIX)
            and d not in complete
            and d.name[len(_PREFIX) :].isdigit()
            and int(d.name[len(_PREFIX) :]) < newest
        ):
            doomed.append(d)
    for d in doomed:
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def check_meta(ckpt: Checkpoint, expected: dict[str, Any]) -> None:
    """Raise MismatchError when `ckpt` was written by another job, pipeline or schedule."""
    for key, want in expected.items():
        got = ckpt.meta.get(key)
        if got != want:
            what = key.replace("_", " ")
            if isinstance(got, dict) and isinstance(want, dict):
                # name the first field that differs (one only in either counts too)
                field = min(
                    k
                    for k in got.keys() | want.keys()
                    if k not in got or k not in want or got[k] != want[k]
                )
                got, want = got.get(field, "no value"), want.get(field, "no value")
                what = f"{what} setting, {field}"
            if key == "schedule_sha256":  # of the schedule as trained: the file and its overrides
                what += " (the schedule file with --warmup-steps and --full-update-every applied)"
            raise MismatchError(
                f"checkpoint {ckpt.path} was written with another {what} ({short(got, 40)} there, "
                f"{short(want, 40)} now); resume with the same job, schedule and options, or train "
                "into a fresh --out-dir"
            )


def _first_line(e: BaseException) -> str:
    """The first line of an error's message (its type's name where it has none)."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
