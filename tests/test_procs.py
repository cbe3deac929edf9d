"""No child of freezeopt outlives it, and no temp file either (`freezeopt.procs`), with real
processes and real signals: a child's whole process group goes when its `with` is left by an
error; a SIGKILLed parent takes its children with it (the kernel's parent-death signal); a run
folder whose owner is gone is swept and a live one kept; and `freezeopt solve` with CBC busy on
a MILP, told to stop by SIGINT, SIGTERM or SIGHUP, kills CBC, removes its files and exits 128 + N
with one line, while after SIGKILL CBC dies too and the next run sweeps the files.

Every wait polls up to a generous deadline; nothing here asserts how long anything took.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks.procs import alive, children
from freezeopt import procs
from freezeopt.commands import synth_file
from freezeopt.profiling.synth import SynthOptions

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

DEADLINE_S = 120.0
"""The longest any wait here polls (a slow, loaded machine gets all of it)."""


def _until(cond: Callable[[], object], what: str, deadline_s: float = DEADLINE_S) -> object:
    end = time.monotonic() + deadline_s
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < end, f"still waiting for {what} after {deadline_s:g} s"
        time.sleep(0.1)


def _descendants(pid: int) -> set[int]:
    out: set[int] = set()
    todo = [pid]
    while todo:
        for c in children(todo.pop()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _env(tmp: Path) -> dict[str, str]:
    """This environment with its own temp folder and no run folder inherited from this process."""
    env = {k: v for k, v in os.environ.items() if k != procs.RUN_DIR_ENV}
    return {**env, "TMPDIR": str(tmp)}


# --- the mechanism ------------------------------------------------------------------------------


def test_leaving_a_child_by_an_error_kills_its_whole_group() -> None:
    pids: set[int] = set()
    shell = ["sh", "-c", "sleep 1000 & exec sleep 1000"]
    with pytest.raises(RuntimeError, match="boom"), procs.child(shell) as proc:
        _until(lambda: children(proc.pid), "the shell's background sleep")
        pids = {proc.pid} | children(proc.pid)
        raise RuntimeError("boom")
    assert len(pids) == 2
    _until(lambda: not alive(pids), "the group to die")
    assert proc.returncode == -signal.SIGKILL


def test_children_die_with_a_sigkilled_parent(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from freezeopt import procs\n"
        "p = procs.start(['sleep', '1000'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(1000)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env=_env(tmp_path), text=True
    )
    kid = 0
    try:
        assert parent.stdout is not None
        kid = int(parent.stdout.readline())
        assert alive([kid])
        parent.kill()  # no handler runs: the kernel must end the child
        parent.wait()
        _until(lambda: not alive([kid]), "the orphan to die")
    finally:
        parent.kill()
        parent.wait()
        if alive([kid]):
            os.kill(kid, signal.SIGKILL)


def test_the_sweep_removes_run_folders_whose_owner_is_gone_and_keeps_live_ones(
    tmp_path: Path,
) -> None:
    make = "from freezeopt import procs; import os, sys; print(procs.run_dir(), flush=True)\n"
    live = subprocess.Popen(
        [sys.executable, "-c", make + "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env(tmp_path), text=True,
    )  # fmt: skip
    try:
        assert live.stdout is not None
        kept = Path(live.stdout.readline().strip())
        dead = subprocess.run(
            [sys.executable, "-c", make + "os._exit(0)"],  # no clean-up: as if killed
            capture_output=True, text=True, env=_env(tmp_path), check=True,
        )  # fmt: skip
        left = Path(dead.stdout.strip())  # its own sweep kept the live one
        assert left.is_dir() and kept.is_dir() and left.parent == kept.parent == tmp_path
        link = tmp_path / left.name.replace(left.name.split(".")[1], "1", 1)
        link.symlink_to(kept)  # named for a gone owner, but a link: never followed or removed
        assert procs.sweep(tmp_path) == [left]
        assert not left.exists() and kept.is_dir() and link.is_symlink()
    finally:
        live.communicate("")
    assert not kept.exists()  # its owner removed it on exit


# --- `freezeopt solve` told to stop -------------------------------------------------------------


@pytest.fixture(scope="module")
def busy_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A profile whose MILP CBC works on for minutes at gap 0 (100 s here, not proven)."""
    out = tmp_path_factory.mktemp("busy") / "p16.json"
    synth_file(SynthOptions(ranks=4, microbatches=16, groups=4), out)
    return out


@pytest.fixture(scope="module")
def small_profile_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("small") / "p.json"
    synth_file(SynthOptions(ranks=2, microbatches=4, groups=2), out)
    return out


def _solve(profile: Path, tmp: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "freezeopt", "solve", str(profile), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(tmp),
        # a shell starts background jobs with SIGINT ignored (nohup, SIGHUP), and freezeopt
        # keeps an ignored signal ignored
        preexec_fn=_default_signals,
    )


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


Busy = tuple[subprocess.Popen[bytes], Path, set[int]]


@pytest.fixture
def busy_cbc(busy_profile: Path, tmp_path: Path) -> Iterator[Busy]:
    """`freezeopt solve` with CBC on the MILP, its temp folder, and its descendants once CBC runs
    (phase 1, from its start: `-mips`); whatever a failed test leaves is killed."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _solve(busy_profile, tmp, "--gap", "0", "--time-limit", "100000")
    seen: set[int] = set()
    try:

        def cbc() -> bool:
            assert proc.poll() is None, proc.communicate()
            seen.update(_descendants(proc.pid))
            return any(b"-mips" in _cmdline(p) for p in seen)

        _until(cbc, "CBC on the MILP")
        yield proc, tmp, seen
    finally:
        for p in alive(seen):
            os.kill(p, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "said"),
    [
        (signal.SIGINT, "error: interrupted (Ctrl-C)"),
        (signal.SIGTERM, "error: stopped by SIGTERM"),
        (signal.SIGHUP, "error: stopped by SIGHUP"),
    ],
)
def test_a_stop_signal_kills_cbc_and_removes_its_files(
    busy_cbc: Busy, sig: signal.Signals, said: str
) -> None:
    proc, tmp, seen = busy_cbc
    assert any(tmp.rglob("model.mps"))  # in the run folder
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 128 + sig, err
    assert err.decode().splitlines() == [said]
    _until(lambda: not alive(seen), "every child to be gone")
    assert list(tmp.iterdir()) == []


@pytest.mark.slow
def test_after_sigkill_cbc_dies_too_and_the_next_run_sweeps_its_files(
    busy_cbc: Busy, small_profile_file: Path
) -> None:
    proc, tmp, seen = busy_cbc
    proc.kill()
    proc.communicate(timeout=DEADLINE_S)
    _until(lambda: not alive(seen), "CBC to die with its parent")
    (left,) = tmp.iterdir()  # the killed run could not remove its folder
    assert left.name.startswith(f"freezeopt-run.{proc.pid}.") and any(left.rglob("model.mps"))
    nxt = _solve(small_profile_file, tmp, "--time-limit", "30")
    _, err = nxt.communicate(timeout=DEADLINE_S)
    assert nxt.returncode == 0, err
    assert list(tmp.iterdir()) == []


@pytest.mark.slow
def test_sigterm_ends_a_solve_stuck_in_native_highs(busy_profile: Path, tmp_path: Path) -> None:
    """HiGHS solves phase 1 in this process and runs no Python (no signal handler) until it
    returns, which at gap 0 is the time limit: `run_scope` ends the run `GRACE_S` after SIGTERM."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    model = tmp_path / "m.lp"  # written just before phase 1 starts
    args = (
        "--solver",
        "highs",
        "--gap",
        "0",
        "--time-limit",
        "100000",
        "--write-model",
        str(model),
    )
    proc = _solve(busy_profile, tmp, *args)
    try:
        _until(lambda: model.exists() or proc.poll() is not None, "phase 1's model")
        assert proc.poll() is None, proc.communicate()
        busy = _cpu_s(proc.pid) + 2.0  # well into HiGHS: CPU time, not wall time
        _until(lambda: _cpu_s(proc.pid) > busy or proc.poll() is not None, "HiGHS at work")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=DEADLINE_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.decode().splitlines() == ["error: stopped by SIGTERM"]
    assert list(tmp.iterdir()) == []


def _cpu_s(pid: int) -> float:
    """CPU seconds `pid` has used (user + system), 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
