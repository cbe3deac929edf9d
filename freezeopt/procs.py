"""Child processes that never outlive freezeopt, the run's private temp folder, and SIGTERM and
SIGHUP turned into an orderly stop.

What:
* `child(args, ...)` (or `start` and `stop`): a process — CBC, the HiGHS child, the re-plan
  worker — in a process group of its own, which the kernel SIGKILLs when the thread that started
  it dies (Linux `prctl(PR_SET_PDEATHSIG)`, set in the child between fork and exec: SIGKILL to
  freezeopt leaves nothing running). Leaving the `with` however it is left (an answer, an error,
  the exception a signal raises) SIGKILLs the group and reaps it. Each is started by a thread that
  waits for it or outlives it (the solve's own thread; the rank's main thread for the re-plan
  worker): were that thread to end first, the kernel would kill the child then. A child started
  just as a signal arrives, before `start` could note it, still dies with the process.
* `die_with_parent(pid)`: the same death signal, set from inside a process started some other
  way, with a thread polling the parent where there is no prctl; `die_with_launcher`: the same
  for a rank, whose parent is multiprocessing's fork server rather than freezeopt.
* `scratch(kind)`: a folder for one solve's files inside the run's private folder (mode 0700,
  `freezeopt-run.<pid>.<start time>.<pid namespace>.<random>` in the temp folder, shared by every
  process of the run through `FREEZEOPT_RUN_DIR`), removed on leaving the `with`. The run folder
  goes when the command ends; one a SIGKILLed run left is removed by the first `scratch` of a
  later process, which reads the owner from the name and sweeps the folders whose owner is gone.
* `run_scope(line)`, the CLI's: the run folder, SIGTERM and SIGHUP raising `StoppedError` in the
  main thread (exit 128 + N) as Ctrl-C raises KeyboardInterrupt, so `finally` blocks stop the
  children; and a main thread that runs no handler because it sits in a long native call (an
  in-process HiGHS solve) is not waited for: `GRACE_S` after the signal a thread kills the
  children, removes the run folder, prints `line(signum)` and exits.

Why a module at the bottom layer: the solver, torchpp and training start children, and one
mechanism in one place is what makes "no child outlives freezeopt" checkable.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from freezeopt.errors import FreezeoptError, StoppedError

__all__ = [
    "GRACE_S",
    "RUN_DIR_ENV",
    "child",
    "die_with_launcher",
    "die_with_parent",
    "launcher",
    "raise_on_signals",
    "run_dir",
    "run_scope",
    "scratch",
    "start",
    "stop",
    "sweep",
]

GRACE_S = 10.0
"""Seconds a stop signal leaves the main thread to unwind (stopping ranks takes up to 6) before
`run_scope`'s thread ends the process itself."""
RUN_DIR_ENV = "FREEZEOPT_RUN_DIR"
"""The run's private temp folder, inherited by every process of the run."""
_PREFIX = "freezeopt-run."
_PR_SET_PDEATHSIG = 1
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()  # looked up here: between fork and exec nothing should be imported
_lock = threading.Lock()
_children: dict[int, subprocess.Popen[Any]] = {}


# --- children -----------------------------------------------------------------------------------


def _die_with(parent: int) -> bool:
    """Have the kernel SIGKILL this process when the thread of `parent` that started it ends;
    exit now if it already has. False where there is no prctl."""
    if _prctl is None or _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() != parent:  # the parent died before the prctl
        os._exit(1)
    return True


def _setup(parent: int) -> Callable[[], None]:
    def setup() -> None:  # in the child, between fork and exec
        os.setpgid(0, 0)
        _die_with(parent)

    return setup


def start(args: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """Start `args` (keyword arguments as for `subprocess.Popen`) in a process group of its own
    that dies with this process's calling thread; end it with `stop`."""
    proc: subprocess.Popen[Any] = subprocess.Popen(
        list(args), preexec_fn=_setup(os.getpid()), **popen
    )
    with _lock:
        _children[proc.pid] = proc
    return proc


def stop(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL `proc`'s process group unless it has ended, and reap it."""
    try:
        if proc.poll() is None:  # not reaped: its pid, the group's id, cannot be anyone else's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        with _lock:
            _children.pop(proc.pid, None)


@contextlib.contextmanager
def child(args: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """`start` on entering, `stop` on leaving, however it is left."""
    proc = start(args, **popen)
    try:
        yield proc
    finally:
        stop(proc)


def die_with_parent(parent: int) -> None:
    """End this process (a rank, or a rank's re-plan solver) when the process that started it is
    gone (SIGKILLed, say), so nothing is left running, or holding a port, behind a dead parent. On
    Linux the kernel delivers SIGKILL (`prctl(PR_SET_PDEATHSIG)`); elsewhere a thread polls the
    parent's pid."""
    if _die_with(parent):
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="freezeopt-parent-watch", daemon=True).start()


def launcher() -> tuple[int, str]:
    """This process as `die_with_launcher` names it: (pid, start time), so a reused pid is not
    taken for it."""
    pid = os.getpid()
    return pid, _start_time(pid) or "0"


def die_with_launcher(who: tuple[int, str]) -> None:
    """End this process when `who` (from `launcher()`) is gone, where `who` is not its parent: a
    rank forked by multiprocessing's fork server, whose parent is the server. The server does
    not end with the process that asked for the rank (each rank holds a copy of the pipe it
    watches), so a thread polls `who` every half second; the parent's death signal is set too."""
    pid, started = who
    die_with_parent(os.getppid())

    def watch() -> None:
        while _start_time(pid) == started:
            time.sleep(0.5)
        os._exit(1)

    if _start_time(pid) != started:
        os._exit(1)
    threading.Thread(target=watch, name="freezeopt-launcher-watch", daemon=True).start()


# --- the run's temp folder ----------------------------------------------------------------------


def _start_time(pid: int | str) -> str | None:
    """A running process's start time (clock ticks since boot: a reused pid has another one), or
    None if it is gone (a zombie is gone). Without /proc: "0" while the pid exists."""
    if not os.path.isdir("/proc"):
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return "0"
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    except (OSError, IndexError):
        return "0"  # unreadable: count it as running
    return None if fields[0] in ("Z", "X") else fields[19]


def _pid_ns() -> str:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _reserve() -> Path:
    """Name this process's run folder (created on first use) and say it to its children."""
    pid = os.getpid()
    name = f"{_PREFIX}{pid}.{_start_time(pid) or '0'}.{_pid_ns()}.{os.urandom(4).hex()}"
    path = Path(tempfile.gettempdir()) / name
    os.environ[RUN_DIR_ENV] = str(path)
    return path


def run_dir() -> Path:
    """The run's private temp folder (mode 0700), created on first use. A process outside any
    `run_scope` (a library caller) names its own, removed when it exits."""
    raw = os.environ.get(RUN_DIR_ENV)
    if raw and Path(raw).name.startswith(_PREFIX):
        path = Path(raw)
    else:
        path = _reserve()
        atexit.register(shutil.rmtree, path, True)
    _sweep_once()
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise FreezeoptError(
                f"the temp folder {path} is not freezeopt's (a link, another user's, or open to "
                "others); remove it, or set TMPDIR to another folder"
            ) from None
    except OSError as e:
        raise FreezeoptError(
            f"cannot create a temp folder in {path.parent}: {e.strerror or e}"
        ) from None
    return path


@contextlib.contextmanager
def scratch(kind: str) -> Iterator[Path]:
    """A fresh folder for one solve's files inside the run's folder, removed on leaving."""
    d = Path(tempfile.mkdtemp(prefix=f"{kind}-", dir=run_dir()))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


_swept: list[bool] = []


def _sweep_once() -> None:
    if not _swept:
        _swept.append(True)
        sweep()


def sweep(root: Path | None = None) -> list[Path]:
    """Remove the run folders in `root` (the temp folder) whose owning process is gone: this
    user's, named by `run_dir`, of this pid namespace (another's pids cannot be checked).
    Returns those removed."""
    root = Path(tempfile.gettempdir()) if root is None else root
    removed = []
    ns = _pid_ns()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for e in entries:
        parts = e.name[len(_PREFIX) :].split(".")
        if not e.name.startswith(_PREFIX) or len(parts) != 4 or parts[2] != ns:
            continue
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue
        pid, started = parts[0], parts[1]
        if not pid.isdigit() or _start_time(pid) == started:
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        removed.append(Path(e.path))
    return removed


# --- stop signals -------------------------------------------------------------------------------


@contextlib.contextmanager
def raise_on_signals(message: Callable[[str], str]) -> Iterator[None]:
    """In the main thread, make SIGTERM and SIGHUP raise `StoppedError(message(name))` (exit
    128 + N), once: a second signal does not break the cleanup the first started. A signal
    ignored on entry (`nohup`) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def handler(signum: int, _frame: Any) -> None:
        if not fired:
            fired.append(signum)
            raise StoppedError(message(signal.Signals(signum).name), signum=signum)

    old: dict[signal.Signals, Any] = {}
    try:
        for sig in STOP_SIGNALS:
            if signal.getsignal(sig) is not signal.SIG_IGN:
                old[sig] = signal.signal(sig, handler)
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


@contextlib.contextmanager
def run_scope(line: Callable[[int], str]) -> Iterator[None]:
    """A command's run (the module docstring): its own run folder, removed at the end; stop
    signals raised in the main thread; and, `GRACE_S` after a stop signal the main thread has not
    ended the run on, the children killed, the folder removed, `line(signum)` on stderr and an
    exit with 128 + N."""
    saved = os.environ.get(RUN_DIR_ENV)
    folder = _reserve()
    main = threading.current_thread() is threading.main_thread()
    r = w = -1
    old_fd = -1
    try:
        if main:
            r, w = os.pipe()
            os.set_blocking(w, False)
            old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
            threading.Thread(
                target=_escalate, args=(r, folder, line), name="freezeopt-stop", daemon=True
            ).start()
        with raise_on_signals(lambda name: f"stopped by {name}"):
            yield
    finally:
        with _lock:
            left = list(_children.values())
        for proc in left:
            stop(proc)
        shutil.rmtree(folder, ignore_errors=True)
        if main:
            signal.set_wakeup_fd(old_fd)
            os.close(w)  # the thread reads the end and leaves
        if saved is None:
            os.environ.pop(RUN_DIR_ENV, None)
        else:
            os.environ[RUN_DIR_ENV] = saved


def _escalate(r: int, folder: Path, line: Callable[[int], str]) -> None:
    """`run_scope`'s thread: read the signal numbers the wakeup fd receives; `GRACE_S` after the
    first stop signal, end the process unless the scope has ended (its end closes the pipe)."""
    stops = {int(s) for s in (*STOP_SIGNALS, signal.SIGINT)}
    first = 0
    deadline = 0.0
    while True:
        wait = max(0.0, deadline - time.monotonic()) if first else None
        try:
            ready, _, _ = select.select([r], [], [], wait)
            data = os.read(r, 64) if ready else None
        except OSError:
            return
        if data == b"":  # the scope ended
            os.close(r)
            return
        if data is None:  # the grace is over
            break
        for s in data:
            if s in stops and not first:
                first, deadline = s, time.monotonic() + GRACE_S
    with _lock:
        left = list(_children.values())
    for proc in left:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):
        os.write(2, (line(first) + "\n").encode())
    os._exit(128 + first)
