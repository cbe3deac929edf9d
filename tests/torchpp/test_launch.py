"""Distributed faults in a real 2-rank run: a rank killed with SIGKILL, a port already taken.

Both must stop every rank within a bounded time, name the rank and the cause in one line, write no
profile and leave no process behind. (Crashing and hanging ranks: tests/profiling/test_run.py.)
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import freezeopt.torchpp.launch as launch
from benchmarks.procs import alive, children
from freezeopt.errors import FreezeoptError, RankFailedError
from freezeopt.profiling.run import profile_job
from freezeopt.torchpp.job import load_job, replace_job

pytestmark = pytest.mark.slow


def _job():
    return replace_job(
        load_job("tiny-gpt"),
        measure_steps=3,
        warmup_steps=1,
        cost_samples=2,
        lag_samples=4,
        val_batches=1,
        hang_timeout_s=10,
        model_args={"d_model": 32, "n_heads": 2, "n_layers": 4, "mlp_ratio": 2},
        data_args={"max_train_bytes": 100000, "max_val_bytes": 10000, "val_every": 10},
    )


def test_killed_rank_is_named(tmp_path: Path) -> None:
    before = children(os.getpid(), zombies=True)
    out = tmp_path / "p.json"
    t0 = time.monotonic()
    with pytest.raises(FreezeoptError) as e:
        profile_job(_job(), out=out, progress=False, fault="kill:rank=1,step=2")
    assert time.monotonic() - t0 < 120
    msg = str(e.value)
    assert msg.startswith("rank 1 ") and "killed by signal 9" in msg and "\n" not in msg
    assert not out.exists()
    assert children(os.getpid(), zombies=True) <= before


def test_port_already_in_use(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    monkeypatch.setattr(launch, "_free_port", lambda: port)
    before = children(os.getpid(), zombies=True)
    out = tmp_path / "p.json"
    try:
        with pytest.raises(FreezeoptError) as e:
            profile_job(_job(), out=out, progress=False)
    finally:
        taken.close()
    msg = str(e.value)
    assert "\n" not in msg and "rank" in msg
    assert "address already in use" in msg.lower() or str(port) in msg
    assert not out.exists()
    assert children(os.getpid(), zombies=True) <= before


def _start_profile(tmp_path: Path) -> tuple[subprocess.Popen[bytes], set[int]]:
    """`freezeopt profile` of a long job in its own process; returns it once both ranks run."""
    job = replace_job(_job(), measure_steps=10_000, name="long")
    spec = tmp_path / "long.yaml"
    spec.write_text(yaml.safe_dump(job.to_dict()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "freezeopt", "profile", str(spec), "-o", str(tmp_path / "p.json")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # a shell starts background jobs with SIGINT ignored, and Python then keeps it ignored (no
        # KeyboardInterrupt): CI run in the background would not test Ctrl-C at all
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    ranks: set[int] = set()
    while time.monotonic() < deadline and len(ranks) < 2:
        time.sleep(0.5)
        ranks = children(proc.pid)
        assert proc.poll() is None, proc.communicate()
    assert len(ranks) == 2, ranks
    time.sleep(3)  # into the run (torch imported, process group up)
    return proc, ranks


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [
        (signal.SIGTERM, 143, "error: stopped by SIGTERM; every rank was stopped"),
        (signal.SIGINT, 130, "error: interrupted (Ctrl-C); every rank was stopped"),
    ],
)
def test_a_signal_to_freezeopt_stops_every_rank(
    tmp_path: Path, sig: signal.Signals, code: int, said: str
) -> None:
    proc, ranks = _start_profile(tmp_path)
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=60)
    finally:  # never leave a profiling job behind to slow the tests after this one
        if proc.poll() is None:
            proc.kill()
            for r in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(r, signal.SIGKILL)
    assert proc.returncode == code, err
    lines = err.decode().strip().splitlines()
    assert lines[-1].startswith(said) and lines[-1].endswith("no profile was written"), err
    assert "Traceback" not in err.decode()
    assert not alive(ranks)  # and within `communicate`'s 60 s
    assert not (tmp_path / "p.json").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ranks_die_with_a_killed_parent(tmp_path: Path) -> None:
    proc, ranks = _start_profile(tmp_path)
    proc.kill()  # SIGKILL: no handler runs in the parent; the kernel must take the ranks down
    proc.communicate(timeout=30)
    deadline = time.monotonic() + 60  # each rank's watcher polls twice a second; a loaded host lags
    while alive(ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(ranks)


def test_a_wrapped_error_keeps_its_cause_on_the_one_line() -> None:
    """torch 2.13's PipelineStage re-raises an error of a stage's forward as `RuntimeError([Stage
    1] failed to run forward:\\n args: …) from e`: the rank's one line carries the cause too."""
    from freezeopt.torchpp.launch import error_line

    try:
        try:
            raise ValueError("the head broke")
        except ValueError as e:
            raise RuntimeError("[Stage 1] failed to run forward:\nargs: ('tensor',)") from e
    except RuntimeError as wrapped:
        line = error_line(wrapped)
    assert line == (
        "RuntimeError: [Stage 1] failed to run forward:; caused by ValueError: the head broke"
    )
    assert error_line(ValueError("plain")) == "ValueError: plain"
    try:
        raise KeyError("k") from None
    except KeyError as e:
        assert error_line(e) == "KeyError: 'k'"


def _burn(ctx: launch.RankContext) -> float:
    """A rank's target: spin for 1 s of this thread's CPU, return the CPU seconds spent."""
    t0 = time.thread_time()
    while time.thread_time() - t0 < 1.0:
        pass
    return time.thread_time() - t0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_ranks_cpu_counts_as_freezeopts_own() -> None:
    """Ranks are the fork server's children, not freezeopt's: their CPU must still count as
    freezeopt's, or every run would call its own ranks 'other processes' and its host busy."""
    before = launch.cpu_snapshot()
    burnt = launch.run_ranks(
        _job(), _burn, total_units=1, progress=False, verb="burning", outcome=str, log_prefix="t"
    )
    after = launch.cpu_snapshot()
    assert before is not None and after is not None
    assert sum(burnt) >= 2.0
    assert after[1] - before[1] >= sum(burnt)  # CPU seconds: holds however busy the host is


def _refuse(why: str) -> None:
    raise RuntimeError(why)


class _Unloadable:
    """Unpickling this raises, as a target holding something a rank cannot rebuild would."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_refuse, ("this object cannot be rebuilt in the rank",))


def _never(ctx: launch.RankContext, payload: object) -> None:
    raise AssertionError("unreachable: the rank cannot unpickle its target")


def test_before_its_log_takes_the_fork_servers_last_exception_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other ranks write to the fork server's log too: the last exception line is the cause."""
    server = tmp_path / "forkserver.log"
    monkeypatch.setattr(launch, "fork_server_log", lambda: server)
    missing = tmp_path / "rank0.log"  # a rank that died before it created its log
    server.write_text(
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "_pickle.UnpicklingError: the payload is gone\n"
        "[W1205 17:00:00 ProcessGroupGloo.cpp:1] a warning from another rank\n\n"
    )
    assert launch._before_its_log(missing) == (
        ", before it opened its log: _pickle.UnpicklingError: the payload is gone"
    )
    server.write_text("one line\nthe last line\n")  # no exception: the last line
    assert launch._before_its_log(missing) == ", before it opened its log: the last line"
    missing.write_text("")  # a rank that created its log, even one it wrote nothing in, opened it
    assert launch._before_its_log(missing) == ""


def test_a_target_that_cannot_be_rebuilt_in_the_rank_is_that_ranks_reported_error() -> None:
    """The target is rebuilt after the rank's log is open: the error comes back through the queue,
    one clean line, not a death the fork server prints into the log every rank shares (two ranks
    printing the same traceback there at once once interleaved it mid-line)."""
    import functools

    with pytest.raises(RankFailedError) as e:
        launch.run_ranks(
            _job(),
            functools.partial(_never, payload=_Unloadable()),
            total_units=1,
            progress=False,
            verb="starting",
            outcome=lambda: "nothing was written",
            log_prefix="t",
        )
    msg = str(e.value)
    assert "\n" not in msg and "died" not in msg, msg
    # both ranks fail alike; whichever reported first is named
    assert re.match(
        r"rank [01] failed in start: RuntimeError: this object cannot be rebuilt in the rank; ", msg
    ), msg
    assert "nothing was written" in msg


class _Proc:
    """A rank process as `_supervise` sees it: its exit code, known from `at` (monotonic) on."""

    def __init__(self, exitcode: int | None, at: float = 0.0) -> None:
        self._code, self._at = exitcode, at

    @property
    def exitcode(self) -> int | None:
        return self._code if time.monotonic() >= self._at else None


def test_a_lost_connection_waits_for_the_peer_that_broke_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 reports a lost connection at once; rank 1's death (SIGKILL) is known only 3 s later,
    as from a fork server starved on a loaded host: the error names rank 1, not its symptom."""
    import queue

    for r in (0, 1):
        (tmp_path / f"rank{r}.log").write_text("")  # opened: the fork server's lines are not theirs
    monkeypatch.setattr(launch, "fork_server_log", lambda: tmp_path / "forkserver.log")
    q: queue.Queue[tuple[object, ...]] = queue.Queue()
    now = time.monotonic()
    q.put(("error", 0, now, 2, 2, "RuntimeError: Connection closed by peer [127.0.0.1]:1", None))
    procs = [_Proc(1), _Proc(-9, at=now + 3.0)]
    beats = [now] + [0.0] * (launch._BEAT_FIELDS - 1)
    with pytest.raises(RankFailedError) as e:
        launch._supervise(
            _job(), procs, q, beats * 2, tmp_path, lambda *_: None, lambda: "nothing was written"
        )
    assert str(e.value).startswith("rank 1 ") and "killed by signal 9" in str(e.value)
    assert time.monotonic() - now >= 3.0
