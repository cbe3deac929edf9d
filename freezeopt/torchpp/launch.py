"""Starting a job's ranks and watching them: spawn or torchrun, heartbeats, crash and hang detection.

Why a module of its own: `freezeopt profile` and `freezeopt train` run the same kind of
multi-process job and must fail the same way — one clear error naming the rank, never a wedged
terminal or a pile of tracebacks. This module knows nothing about what a rank computes; it runs a
picklable `target(ctx: RankContext)` on every rank and returns the ranks' results in rank order.

How. On one machine `run_ranks` starts one process per rank, forked from a fork server that has
already imported torch (spawned where there is no fork) (gloo on CPU with one thread per rank,
nccl on CUDA with GPU r for rank r; 127.0.0.1 and a free port). Under `torchrun` (RANK and
WORLD_SIZE set) this process is one rank and the results are all-gathered, so every rank returns
all of them. Each spawned rank writes its stdout/stderr to a temporary log and a heartbeat row in
shared memory (time, progress units, phase, and the action it is computing). The parent polls:

* a rank that raises reports its error and every rank is stopped; the root cause (a non-connection
  error first, then the earliest; while every error is a lost connection, the peer's own is
  awaited 10 s) becomes one `RankFailedError` — or, for a user error raised in a rank (a
  `FreezeoptError`), the same error class with `rank R: ` in front;
* a rank without a heartbeat for `hang_timeout_s` (stuck in an action, or every rank waiting) is
  declared hung (starting Python and torch and building the model get at least 2 minutes);
* the whole run is bounded by `timeout_s`;
* SIGTERM or SIGHUP to this process stops every rank, then raises `StoppedError` (exit 143/129);
  a rank whose launcher dies without cleaning up (SIGKILL) ends within a second
  (`freezeopt.procs.die_with_launcher`).

The test-only rank failures both commands inject are `freezeopt.torchpp.faults`' (`crash:rank=R,step=S`, `kill:…`, `hang:…`).
`host_info`, `cpu_snapshot` and `other_cpu` measure how busy the machine was while the ranks ran,
because timings taken next to another busy process are not worth reporting.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue as queue_mod
import re
import resource
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from freezeopt import errors
from freezeopt.errors import FreezeoptError, InputError, RankFailedError
from freezeopt.procs import die_with_launcher, launcher, raise_on_signals, run_dir
from freezeopt.torchpp.job import Job

__all__ = [
    "Beat",
    "RankContext",
    "cpu_snapshot",
    "error_line",
    "host_info",
    "in_torchrun",
    "load_avg",
    "other_cpu",
    "run_ranks",
]

PHASES = (
    "start",
    "setup",
    "validation",
    "warmup",
    "measure",
    "branches",
    "costs",
    "lags",
    "train",
    "checkpoint",
    "done",
)
"""Heartbeat phases (what a rank reports it is doing; named in failure messages)."""
_STARTUP_GRACE_S = 120.0
_BEAT_FIELDS = 8  # per rank: time, units done, phase, computing, stage, kind, microbatch, step
_KINDS = "FBIW"
_CONN_WORDS = (
    "Connection closed by peer",
    "Connection reset",
    "Broken pipe",
    "timed out",
    "Timed out",
)
_GRACE_S = 1.5
"""How long after a rank's error the others' are awaited before the root cause is chosen."""
_CONNECTION_GRACE_S = 10.0
"""The same while every error so far is a lost connection — a symptom of a peer that failed — so
that the peer's own error, or its death as the fork server sees it on a loaded host, comes in."""
R = TypeVar("R")


def _is_connection_error(text: str) -> bool:
    return any(w in text for w in _CONN_WORDS)


# --- heartbeat (shared memory, one row per rank) ------------------------------------------------


class Beat:
    """A rank's liveness and progress, written into shared memory the parent polls."""

    def __init__(self, arr: Any, rank: int) -> None:
        self.a = arr
        self.o = rank * _BEAT_FIELDS
        self.step = -1
        self.set_phase("start")

    @property
    def phase(self) -> str:
        """The phase last set."""
        return PHASES[int(self.a[self.o + 2])]

    def set_phase(self, phase: str) -> None:
        """Enter `phase` (one of `PHASES`)."""
        self.a[self.o + 2] = float(PHASES.index(phase))
        self.a[self.o + 0] = time.monotonic()

    def tick(self, units: float | None = None) -> None:
        """Alive; optionally set the progress units done (the progress bar shows the slowest rank)."""
        self.a[self.o + 0] = time.monotonic()
        if units is not None:
            self.a[self.o + 1] = units

    def computing(self, stage: int, kind: str, mb: int) -> None:
        """Entering action (stage, kind, microbatch) of step `self.step`."""
        a, o = self.a, self.o
        a[o + 0] = time.monotonic()
        a[o + 3] = 1.0
        a[o + 4] = stage
        a[o + 5] = _KINDS.index(kind)
        a[o + 6] = mb
        a[o + 7] = self.step

    def idle(self) -> None:
        """Left the action."""
        self.a[self.o + 0] = time.monotonic()
        self.a[self.o + 3] = 0.0


@dataclass(frozen=True, slots=True)
class _BeatView:
    """What the parent reads about one rank."""

    ts: float
    units: float
    phase: str
    computing: bool
    action: str
    step: int


def _read_beat(arr: Any, rank: int) -> _BeatView:
    o = rank * _BEAT_FIELDS
    v = [arr[o + i] for i in range(_BEAT_FIELDS)]
    action = f"{int(v[4])}{_KINDS[int(v[5])]}{int(v[6])}"
    return _BeatView(
        ts=v[0],
        units=v[1],
        phase=PHASES[int(v[2])],
        computing=v[3] > 0.5,
        action=action,
        step=int(v[7]),
    )


# --- one rank -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RankContext:
    """What a rank's target gets: its rank, the world size, its device and its heartbeat."""

    rank: int
    world: int
    device: Any
    beat: Beat


def rank_device(job: Job, local_rank: int) -> Any:
    """The rank's torch device: GPU `local_rank` for cuda jobs; CPU with one thread otherwise."""
    import torch

    if job.device == "cuda":
        dev = torch.device("cuda", local_rank)
        torch.cuda.set_device(dev)
        return dev
    torch.set_num_threads(1)
    return torch.device("cpu")


def _init_pg(rank: int, world: int, device: Any, init_method: str, timeout_s: float) -> None:
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )


def _worker(
    target_bytes: bytes,
    job: Job,
    rank: int,
    world: int,
    init_method: str,
    beat_arr: Any,
    q: Any,
    log_path: str,
    env: dict[str, str],
    started_by: tuple[int, str],
) -> None:
    """Entry point of a started rank: run, then put ('result', rank, R) or ('error', …) on `q`.

    The target comes pickled and is rebuilt here, after the rank's log is open: a target that
    cannot be rebuilt is then an error this rank reports, with its traceback in its own log —
    not a death the fork server prints, with every other rank's, into one shared file."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    die_with_launcher(started_by)  # freezeopt, which is not this process's parent (the fork server)
    os.environ.clear()  # the launching process's environment, not the fork server's (older)
    os.environ.update(env)
    beat = Beat(beat_arr, rank)
    code = 0
    try:
        import torch.distributed as dist

        target: Callable[[RankContext], Any] = pickle.loads(target_bytes)
        device = rank_device(job, rank)
        # hangs are the parent's to declare (heartbeats); the group's own timeout must not fire
        # first, nor while a slower peer still starts (its model and data built before the
        # first collective), which the parent allows the startup grace for
        timeout = max(2 * job.hang_timeout_s, _STARTUP_GRACE_S)
        _init_pg(rank, world, device, init_method, timeout_s=timeout)
        try:
            res = target(RankContext(rank, world, device, beat))
        finally:
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        beat.set_phase("done")
        q.put(("result", rank, res))
    except BaseException as e:  # report everything, including KeyboardInterrupt, then exit non-zero
        code = 1
        traceback.print_exc()
        user = type(e).__name__ if isinstance(e, FreezeoptError) else None
        q.put(("error", rank, time.monotonic(), beat.step, beat.phase, error_line(e), user))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        q.close()
        q.join_thread()
    os._exit(code)


@contextlib.contextmanager
def _stop_on_signals(outcome: Callable[[], str]) -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into `StoppedError` while ranks run, so the rank processes are
    stopped (the `finally` in `_launch_local`) before this process exits; the default handlers
    would end it on the spot and leave the ranks running."""
    with raise_on_signals(
        lambda name: f"stopped by {name}; every rank was stopped and {outcome()}"
    ):
        yield


def error_line(e: BaseException) -> str:
    """A rank's error on one line, with its cause: torch wraps an error raised in a stage's
    forward or backward as `[Stage 1] failed to run forward:` (the real error only in its
    `__cause__`), so each cause that the message does not already hold is added."""
    parts: list[str] = []
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen and len(parts) < 4:
        seen.add(id(cur))
        text = str(cur).strip()
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        first = lines[0] if lines else ""
        if first.startswith("[") and "gloo" in first and "]" in first:
            first = first.split("]", 1)[1].strip()
        part = f"{type(cur).__name__}: {first}" if first else type(cur).__name__
        if not any(first and first in p for p in parts):
            parts.append(part)
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return parts[0] + "".join(f"; caused by {p}" for p in parts[1:])


# --- launching ----------------------------------------------------------------------------------


def in_torchrun() -> bool:
    """True when launched by torchrun (or another launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_ranks(
    job: Job,
    target: Callable[[RankContext], R],
    *,
    total_units: float,
    progress: bool,
    verb: str,
    outcome: Callable[[], str],
    log_prefix: str,
) -> list[R]:
    """Run `target` on every rank of `job`; return the ranks' results in rank order.

    `target` must be picklable by `pickle` (a module-level function or a `functools.partial` of
    one, over plain data): it is pickled once here and rebuilt in each rank, so tensors in it are
    copied, and multiprocessing queues, locks or shared arrays cannot travel in it. It
    reports progress through `ctx.beat`; `total_units` sizes the progress bar (`verb` names it,
    e.g. "profiling"). `outcome()` ends a failure message (e.g. "no profile was written"), said
    as things stand when the failure comes.
    Raises `RankFailedError` on a crash, hang or timeout, or the user error a rank raised.
    """
    if in_torchrun():
        return _run_torchrun(job, target)
    return _launch_local(
        job,
        target,
        total_units=total_units,
        progress=progress,
        verb=verb,
        outcome=outcome,
        log_prefix=log_prefix,
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PRELOAD = [
    "torch",
    "torch.distributed.pipelining",
    "freezeopt.training.rank",
    "freezeopt.profiling.run",
]
"""What the fork server imports once, so that a rank starts in milliseconds rather than importing
torch for seconds (about 7 s of CPU per rank here; `compare` starts two ranks per run)."""


def _context() -> Any:
    """How ranks are started: forked from a fork server that has imported torch (POSIX), else
    spawned. The fork server is one process per freezeopt process, started on first use; it exits
    once freezeopt and its ranks have, and a rank ends when freezeopt does (`die_with_launcher`).
    Its stderr is a
    file in the run's private folder (`fork_server_log`), not the terminal: a rank forked just as
    a signal stops the run fails before it can open its own log, and its traceback belongs there."""
    import torch.multiprocessing as mp

    if sys.platform == "win32":
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    _ensure_fork_server()
    return ctx


def fork_server_log() -> Path:
    """Where the fork server's own output goes (in the run's private temp folder)."""
    return run_dir() / "forkserver.log"


def _ensure_fork_server() -> None:
    """Start the fork server, if it is not running, with its stderr and stdout in
    `fork_server_log()` (it inherits them from this process when it starts)."""
    from multiprocessing import forkserver

    if _fork_server_pid() is not None:
        return
    fd = os.open(fork_server_log(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    saved = os.dup(1), os.dup(2)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        forkserver.ensure_running()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def _fork_server_pid() -> int | None:
    """The pid of this process's fork server, or None (Linux: read from /proc)."""
    me = os.getpid()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat_line = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat_line[1]) != me or stat_line[0] in ("Z", "X"):
                continue
            if b"multiprocessing.forkserver" in Path(f"/proc/{name}/cmdline").read_bytes():
                return int(name)
        except (OSError, IndexError, ValueError):
            continue
    return None


def _launch_local(
    job: Job,
    target: Callable[[RankContext], R],
    *,
    total_units: float,
    progress: bool,
    verb: str,
    outcome: Callable[[], str],
    log_prefix: str,
) -> list[R]:
    world = job.ranks
    target_bytes = pickle.dumps(target)  # rebuilt in each rank once its log is open (`_worker`)
    ctx = _context()
    q = ctx.Queue()
    beat_arr = ctx.Array("d", world * _BEAT_FIELDS, lock=False)
    now = time.monotonic()
    for r in range(world):
        beat_arr[r * _BEAT_FIELDS] = now
    logdir = Path(tempfile.mkdtemp(prefix=f"freezeopt-{log_prefix}-"))
    init = f"tcp://127.0.0.1:{_free_port()}"
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                target_bytes,
                job,
                r,
                world,
                init,
                beat_arr,
                q,
                str(logdir / f"rank{r}.log"),
                dict(os.environ),
                launcher(),
            ),
            name=f"freezeopt-rank{r}",
            daemon=True,
        )
        for r in range(world)
    ]
    keep_logs = True
    try:
        with _stop_on_signals(outcome):
            for p in procs:
                p.start()
            with _progress_bar(progress, verb, job.name, total_units) as update:
                results = _supervise(job, procs, q, beat_arr, logdir, update, outcome)
        keep_logs = False
        return results
    except FreezeoptError as e:  # a user error raised inside a rank: its one line says everything
        if not isinstance(e, RankFailedError):
            keep_logs = False
        raise
    except KeyboardInterrupt:  # Ctrl-C: said as SIGTERM's stop is (exit 130)
        raise errors.StoppedError(
            f"interrupted (Ctrl-C); every rank was stopped and {outcome()}", signum=signal.SIGINT
        ) from None
    finally:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.terminate()
        deadline = time.monotonic() + 5
        for p in started:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(1)
        q.close()
        if not keep_logs:
            shutil.rmtree(logdir, ignore_errors=True)


@contextlib.contextmanager
def _progress_bar(
    enabled: bool, verb: str, name: str, total: float
) -> Iterator[Callable[[float, str], None]]:
    if not enabled:
        yield lambda done, phase: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"[bold]{verb} {{task.fields[name]}}[/] {{task.fields[phase]:<10}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task(verb, total=total, name=name, phase="start")

        def update(done: float, phase: str) -> None:
            bar.update(task, completed=min(done, total), phase=phase)

        yield update


_Err = tuple[float, int, str, str, str | None]  # time, step, phase, message, user-error class


def _supervise(
    job: Job,
    procs: list[Any],
    q: Any,
    beat_arr: Any,
    logdir: Path,
    update: Callable[[float, str], None],
    outcome: Callable[[], str],
) -> list[Any]:
    """Collect results; on a crash or hang raise one clear error naming the rank (module docstring)."""
    world = len(procs)
    results: dict[int, Any] = {}
    errs: dict[int, _Err] = {}
    dead_since: dict[int, float] = {}
    first_bad: float | None = None
    t0 = time.monotonic()
    while len(results) < world:
        try:
            msg = q.get(timeout=0.2)
        except queue_mod.Empty:
            msg = None
        now = time.monotonic()
        if msg is not None:
            if msg[0] == "result":
                results[msg[1]] = msg[2]
            else:
                _, r, ts, step, phase, text, user = msg
                errs.setdefault(r, (ts, step, phase, text, user))
                first_bad = first_bad or now
            continue
        for r, p in enumerate(procs):
            if p.exitcode is not None and r not in results and r not in errs:
                dead_since.setdefault(r, now)
                # killed by a signal: no report can come; otherwise give the report 2 s to arrive
                if p.exitcode < 0 or now - dead_since[r] > 2.0:
                    how = (
                        f"killed by signal {-p.exitcode}"
                        if p.exitcode < 0
                        else f"exit code {p.exitcode}"
                    )
                    b = _read_beat(beat_arr, r)
                    errs[r] = (
                        b.ts,
                        b.step,
                        b.phase,
                        f"the process died ({how}) without reporting an error"
                        + _before_its_log(logdir / f"rank{r}.log"),
                        None,
                    )
                    first_bad = first_bad or now
        conn_only = all(_is_connection_error(e[3]) for e in errs.values())
        grace = _CONNECTION_GRACE_S if conn_only else _GRACE_S
        if (
            errs
            and first_bad is not None
            and (now - first_bad > grace or all(p.exitcode is not None for p in procs))
        ):
            raise _failure(errs, logdir, outcome)
        views = [_read_beat(beat_arr, r) for r in range(world)]
        live = [r for r in range(world) if r not in results]
        stale = [r for r in live if now - views[r].ts > _hang_limit(job, views[r])]
        stuck = [r for r in stale if views[r].computing]
        if stuck or (live and len(stale) == len(live)):
            raise _hang(job, views, stuck or stale, live, logdir, outcome)
        if now - t0 > job.timeout_s:
            slow = min(live, key=lambda r: views[r].units)
            raise RankFailedError(
                f"the run took longer than timeout_s={job.timeout_s:g} s (slowest: rank {slow} in {views[slow].phase}); "
                f"every rank was stopped and {outcome()} (rank logs: {logdir})",
                rank=slow,
                cause="timeout",
            )
        slowest = min(views, key=lambda v: v.units)
        update(slowest.units, slowest.phase)
    return [results[r] for r in range(world)]


_RAISED = re.compile(r"(?<![A-Za-z0-9_])(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception): .*$")
"""A Python exception's last traceback line, from its type on (whatever a line holds before it)."""


def _before_its_log(log: Path) -> str:
    """Where a rank died before it created its log (in the fork server, before `_worker` ran: a
    signal, or arguments it could not rebuild), what the fork server printed for it — its last
    exception line (`SomethingError: …`; else its last line: every rank the server forked writes
    there) — since there is no log to name. A rank whose log exists, even empty, opened it: the
    fork server's lines are then another process's."""
    if log.exists():
        return ""
    try:
        text = fork_server_log().read_text(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in reversed(text.splitlines()) if ln.strip()]
    raised = (m.group(0) for ln in lines if (m := _RAISED.search(ln)) is not None)
    last = next(raised, lines[0] if lines else "")
    return f", before it opened its log: {last[:300]}" if last else ""


def _hang_limit(job: Job, view: _BeatView) -> float:
    """How long a rank may go without a heartbeat: starting Python and torch, and building the model
    and data (one long call that cannot report progress), get at least 2 minutes."""
    if view.phase in ("start", "setup"):
        return max(job.hang_timeout_s, _STARTUP_GRACE_S)
    return job.hang_timeout_s


def _failure(errs: dict[int, _Err], logdir: Path, outcome: Callable[[], str]) -> FreezeoptError:
    """The root cause among the ranks' errors: a non-connection error first, then the earliest."""
    ranked = sorted(errs.items(), key=lambda kv: (_is_connection_error(kv[1][3]), kv[1][0]))
    r, (_, step, phase, text, user) = ranked[0]
    if user is not None:
        cls = getattr(errors, user, None)
        if not (isinstance(cls, type) and issubclass(cls, FreezeoptError)):
            cls = FreezeoptError
        return cls(f"rank {r}: {text.split(': ', 1)[-1]}")
    where = f"step {step} ({phase})" if step >= 0 else phase
    return RankFailedError(
        f"rank {r} failed in {where}: {text}; every rank was stopped and {outcome()} "
        f"(rank log: {logdir / f'rank{r}.log'})",
        rank=r,
        cause=text,
    )


def _hang(
    job: Job,
    views: list[_BeatView],
    suspects: list[int],
    live: list[int],
    logdir: Path,
    outcome: Callable[[], str],
) -> RankFailedError:
    r = min(suspects, key=lambda k: (not views[k].computing, views[k].ts))
    v = views[r]
    doing = (
        f"in action {v.action} of step {v.step}" if v.computing else f"in {v.phase} (step {v.step})"
    )
    others = [k for k in live if k != r]
    tail = ""
    if len(others) == 1:
        tail = f"; rank {others[0]} was waiting"
    elif others:
        tail = f"; ranks {', '.join(map(str, others))} were waiting"
    return RankFailedError(
        f"rank {r} hung {doing}: no progress for {job.hang_timeout_s:g} s{tail}; every rank was stopped and "
        f"{outcome()} (raise hang_timeout_s if actions really take that long; rank log: {logdir / f'rank{r}.log'})",
        rank=r,
        cause="hang",
    )


def _run_torchrun(job: Job, target: Callable[[RankContext], R]) -> list[R]:
    """This process is one rank of a torchrun job: run it, then all-gather every rank's result."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != job.ranks:
        raise InputError(
            f"torchrun started {world} processes but the job has ranks: {job.ranks}; make them equal"
        )
    device = rank_device(job, int(os.environ.get("LOCAL_RANK", "0")))
    _init_pg(rank, world, device, "env://", timeout_s=job.hang_timeout_s)
    try:
        beat = Beat([0.0] * (world * _BEAT_FIELDS), rank)
        res = target(RankContext(rank, world, device, beat))
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, res)
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    return gathered


# --- how busy the machine was -------------------------------------------------------------------


def load_avg() -> tuple[float, float, float] | None:
    """The 1/5/15-minute load averages, where the OS reports them."""
    try:
        return os.getloadavg()
    except OSError:
        return None


def cpu_snapshot() -> tuple[float, float] | None:
    """(busy CPU-seconds of the whole machine, CPU-seconds of this process, its reaped children
    and its fork server's)."""
    try:
        v = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    busy = v[0] + v[1] + v[2] + sum(v[5:8])  # user, nice, system, irq, softirq, steal
    tick = os.sysconf("SC_CLK_TCK")
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    ours = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    # the ranks are the fork server's children: their time is in its own reaped-children count
    server = _fork_server_pid()
    if server is not None:
        try:
            f = Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()
            ours += sum(int(x) for x in f[11:15]) / tick  # utime, stime, cutime, cstime
        except (OSError, IndexError, ValueError):
            pass
    return busy / tick, ours


def other_cpu(
    before: tuple[float, float] | None, after: tuple[float, float] | None, wall: float
) -> dict[str, Any]:
    """CPU time other processes used while the ranks ran (Linux; empty elsewhere)."""
    if before is None or after is None or wall <= 0:
        return {}
    other = max(0.0, (after[0] - before[0]) - (after[1] - before[1]))
    return {"other_cpu_s": other, "other_cpu_cores": other / wall}


def host_info() -> dict[str, Any]:
    """CPU counts and the load average before a run."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return {"cpus": os.cpu_count(), "usable_cpus": usable, "load_avg_before": load_avg()}
