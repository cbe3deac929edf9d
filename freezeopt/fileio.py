"""File and stream helpers at the edges: atomic writes (a reader sees the old file or the new one,
never half of either), bounded reads and safe decoding of the files people edit by hand (size
limits, no YAML tags, no stack overflow on deep nesting), and keeping native libraries' chatter
off stdout."""

from __future__ import annotations

import contextlib
import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from freezeopt.errors import FreezeoptError, InputError

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_with",
    "check_output_file",
    "check_output_folder",
    "give_usual_mode",
    "invalid_file",
    "load_json_file",
    "load_yaml_file",
    "non_finite",
    "read_text_file",
    "stdout_discarded",
    "stdout_to_stderr",
]


NAME_MAX = 255
"""The longest file name (bytes) Linux file systems take; temporary files are named
`.fo.XXXXXXXX.tmp<suffix>`, so any name up to this can be written."""


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and a rename."""

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    atomic_write_with(path, write)


def atomic_write_with(path: Path, write: Callable[[Path], None]) -> None:
    """Have `write` write the file at a temporary path in `path`'s folder (with `path`'s suffix,
    for writers that choose a format by it), then rename it onto `path`: a reader, or a failure
    half-way, sees the old file or the new one, never half of either. Every file freezeopt writes
    goes through here."""
    path = Path(path)
    if os.path.isdir(path):  # os.path's tests never raise (Path's do on a folder it may not read)
        raise InputError(f"cannot write {path}: it is a folder; name a file")
    _refuse_special(path, "cannot write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".fo.", suffix=f".tmp{path.suffix}", dir=path.parent)
        os.close(fd)
    except OSError as e:
        raise FreezeoptError(f"cannot write {path}: {e.strerror or e}") from None
    tmp = Path(name)
    existed = os.path.lexists(path)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        give_usual_mode(tmp, path)
        os.replace(tmp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        kept = "; the previous file is unchanged" if existed else ""
        raise FreezeoptError(f"cannot write {path}: {e.strerror or e}{kept}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _refuse_special(path: Path, label: str) -> None:
    """A device, FIFO or socket is never replaced by a regular file (`-o /dev/stdout` as root
    would replace the link in /dev)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise InputError(f"{label} {path}: it is not a regular file (a device, FIFO or socket)")


def check_output_file(path: Path, what: str, *, inputs: tuple[Path, ...] = ()) -> None:
    """Fail now, before minutes of profiling or solving, where `path` could not be written then:
    it names a folder or one of the command's `inputs`, or no file can be created in its folder.
    `what` names it for the user (`-o`, `--gantt`)."""
    path = Path(path)
    if os.path.isdir(path):
        raise InputError(f"{what} {str(path)!r} is a folder; name a file")
    _refuse_special(path, what)
    if len(os.fsencode(path.name)) > NAME_MAX:  # the temporary name beside it is short
        raise InputError(f"{what} {path}: the file name is too long (at most {NAME_MAX} bytes)")
    for src in inputs:
        if os.path.lexists(src) and os.path.realpath(src) == os.path.realpath(path):
            raise InputError(f"{what} {path} is an input of this command; write to another file")
    _check_folder_writable(path.parent, f"{what} {path}")


def check_output_folder(path: Path, what: str) -> None:
    """Like `check_output_file`, for an output folder (`--out-dir`, `compare -o`)."""
    path = Path(path)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise InputError(f"{what} {path} is not a folder (a file or a broken link); name a folder")
    _check_folder_writable(path, f"{what} {path}")


def _check_folder_writable(folder: Path, label: str) -> None:
    """The folder, or the nearest of its parents that exists (the rest will be made), must be a
    folder this process may create files in (as root, `os.access` always says it may)."""
    at = folder
    while not os.path.lexists(at) and at != at.parent:
        at = at.parent
    if not os.path.isdir(at):
        raise InputError(f"{label}: {at} is not a folder")
    if not os.access(at, os.W_OK | os.X_OK):
        raise InputError(f"{label}: cannot create files in {at} (permission denied)")


def give_usual_mode(tmp: str | Path, path: Path) -> None:
    """Give a temporary file (`tempfile.mkstemp` makes it 0600) the mode `path` should end with:
    the mode of the file it replaces, or what `open` would create under the process's umask, so
    a schedule written on a shared machine is as readable as any other file there."""
    try:
        mode = os.stat(path).st_mode & 0o777
    except OSError:
        mode = 0o666 & ~_umask()
    os.chmod(tmp, mode)


def _umask() -> int:
    """The process's umask, read without changing it where Linux says it (`os.umask` sets it, and
    threads writing files meanwhile would get the value it is briefly set to)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Write text (UTF-8) atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr for the duration (solvers print there even when told not
    to); stdout stays for data. A no-op where stdout or stderr has no file descriptor."""
    try:
        err_fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    with _fd1_to(err_fd):
        yield


@contextlib.contextmanager
def stdout_discarded() -> Iterator[None]:
    """Send file descriptor 1 to os.devnull for the duration: for what is never worth reading
    (`highspy.Highs()` prints its banner there before its output can be turned off)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        with _fd1_to(devnull):
            yield
    finally:
        os.close(devnull)


@contextlib.contextmanager
def _fd1_to(fd: int) -> Iterator[None]:
    try:
        out_fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stdout.flush()
    saved = os.dup(out_fd)
    try:
        os.dup2(fd, out_fd)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, out_fd)
        os.close(saved)


def invalid_file(source: str, what: str, error: Any, *, fields: str) -> InputError:
    """One line for pydantic's first complaint about a decoded file (`error`, a ValidationError):
    where in the file and what is wrong; a key it does not know says so and where `fields` are
    listed (pydantic's own words, "Unexpected keyword argument", say neither)."""
    err = error.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"]
    if err["type"] in ("unexpected_keyword_argument", "extra_forbidden"):
        msg = f"unknown key (the fields are in {fields})"
    return InputError(f"{source}: invalid {what} at {where}: {msg}")


def read_text_file(
    path: Path, *, what: str, limit: int, missing_hint: str, empty_hint: str | None = None
) -> str:
    """Read a UTF-8 text file of at most `limit` bytes; every failure is one InputError line
    (an empty file's says `empty_hint`, or `missing_hint`). Only a regular file is read (a device
    such as /dev/zero reports size 0 and never ends; a FIFO blocks until someone writes), and never
    more than `limit` bytes of it, whatever its size said."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)  # never waits, on a FIFO either
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())  # of what was opened: no window for a swap
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(p)
            if not stat.S_ISREG(st.st_mode):
                raise InputError(
                    f"{what} {p} is not a regular file (a device, FIFO or socket); pass a file"
                )
            if st.st_size > limit:
                raise InputError(
                    f"{what} {p} is too large ({st.st_size / 2**20:.1f} MiB; the limit is {limit / 2**20:.0f} MiB)"
                )
            data = f.read(limit + 1)
        if len(data) > limit:
            raise InputError(f"{what} {p} is too large (over {limit / 2**20:.0f} MiB, the limit)")
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{what} {p} not found; {missing_hint}") from None
    except IsADirectoryError:
        raise InputError(f"{what} {p} is a directory; pass a file") from None
    except UnicodeDecodeError as e:
        raise InputError(f"{what} {p} is not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise InputError(f"cannot read {what} {p}: {e.strerror or e}") from None
    if not text.strip():
        raise InputError(f"{what} {p} is empty; {empty_hint or missing_hint}")
    return text


def load_json_file(path: Path, *, what: str, limit: int, missing_hint: str) -> Any:
    """Read and decode a JSON file (no NaN/Infinity, bounded size and nesting)."""
    text = read_text_file(path, what=what, limit=limit, missing_hint=missing_hint)
    try:
        data = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise InputError(f"{path}: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError and the rejected constants
        raise InputError(f"{path}: not valid JSON ({str(e).splitlines()[0]})") from None
    return data


def non_finite(data: Any, where: str) -> tuple[str, float] | None:
    """The path (`where.key.0`) and value of the first NaN or infinity in decoded data (nested
    dicts and lists, walked without recursion), or None: for the free-form fields of files (a
    profile's `extra`, a job's `model_args`), which no schema types. JSON's `1e999` and YAML's
    `.inf` and `.nan` decode to such floats."""
    stack: list[tuple[str, Any]] = [(where, data)]
    while stack:
        at, x = stack.pop()
        if isinstance(x, float):
            if not math.isfinite(x):
                return at, x
        elif isinstance(x, dict):
            stack.extend((f"{at}.{k}", v) for k, v in reversed(x.items()))
        elif isinstance(x, list | tuple):
            stack.extend((f"{at}.{i}", v) for i, v in reversed(list(enumerate(x))))
    return None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (`json` itself keeps the last silently)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k!r} is given twice; keep one")
        out[k] = v
    return out


def load_yaml_file(
    path: Path, *, what: str, limit: int, missing_hint: str, empty_hint: str | None = None
) -> Any:
    """Read and decode a YAML file safely: plain data only, tags are never constructed, and a key
    given twice in one mapping is an error (YAML itself keeps the last silently)."""
    text = read_text_file(
        path, what=what, limit=limit, missing_hint=missing_hint, empty_hint=empty_hint
    )
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no tags constructed
    except RecursionError:
        raise InputError(f"{path}: YAML nested too deeply") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None)
        if mark is not None and problem:
            raise InputError(
                f"{path}: not valid YAML at line {mark.line + 1}, column {mark.column + 1}: "
                f"{problem}"
            ) from None
        first = str(e).splitlines()[0] if str(e) else "parse error"
        raise InputError(f"{path}: not valid YAML ({first})") from None
    if data is None:  # nothing but comments
        raise InputError(f"{what} {path} is empty; {empty_hint or missing_hint}")
    if not _within(data, MAX_YAML_NODES):
        raise InputError(
            f"{path}: its aliases expand to more than {MAX_YAML_NODES:,} values; write the data "
            "out without anchors (*name) that repeat whole blocks"
        )
    return data


MAX_YAML_NODES = 2_000_000
"""The most values a YAML file may hold once its aliases are expanded: a 1.6 KB file of nested
aliases (`a: &a [x, x, …]`, `b: &b [*a, *a, …]`, …) holds billions, and whatever walks it next
(validation, hashing) would hang."""


def _within(data: Any, limit: int) -> bool:
    """Whether `data`, every alias expanded, holds at most `limit` values (the walk stops there)."""
    seen = 0
    stack = [data]
    while stack:
        x = stack.pop()
        seen += 1
        if seen > limit:
            return False
        if isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list | tuple):
            stack.extend(x)
    return True


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (a hand edit that adds
    `warmup_steps:` below the one already there would otherwise win silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        own = [(k, v) for k, v in node.value if k.tag != "tag:yaml.org,2002:merge"]
        self.flatten_mapping(node)  # merge keys (`<<: *defaults`): the node's own keys win
        for key_node, _ in own:
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice; keep one", key_node.start_mark
                    )
                seen.add(key)
            except TypeError:  # an unhashable key: the safe loader says so itself
                pass
        return super().construct_mapping(node, deep=deep)


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not allowed")
