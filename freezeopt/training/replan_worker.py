"""Online re-plans solved in a process of their own, beside the training loop.

What: `ReplanWorker` runs `freezeopt.training.replan.replan` in one child process per training run (rank
0's, `python -m freezeopt.training.replan_worker`), started with the run so the first re-plan does not
wait for Python to start. Requests and answers are pickles over the child's stdin and stdout. The
child keeps the run's `LpCache`, so each re-plan re-solves the LP warm as before. It runs at lower
CPU priority (nice +5: on a machine whose cores the ranks keep busy, training gets most of them,
and a re-plan still lands within a few steps; at +10 it was starved past the end of short test
runs), loads the compiled simulator and relaxation passes before the first re-plan and then says
it is ready (its first message; `ReplanWorker.ready`), and dies with the rank that started it, in
a process group of its own (`freezeopt.procs`; its own CBC or HiGHS children die with it).

Why not a thread: the heuristic's search holds the GIL (Python between compiled passes, which
are not compiled `nogil`), and a rank's training
loop needs the GIL between every pair of torch calls. Measured (`benchmarks/bench_overlap.py`): a
training-like loop beside a 32×128 heuristic re-plan (7.4 s) ran 664 iterations/s, with a 0.6 s
stall, when the re-plan ran in a thread; 814 beside the process, 818 alone. (Before the search
moved onto arrays it held the GIL longer: 460 in a thread, with a 1.4 s stall.)
Why not `multiprocessing`: ranks are daemonic processes, which may not have children.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from freezeopt import procs
from freezeopt.formats.schedule import Schedule
from freezeopt.training.replan import ReplanOutcome, ReplanSpec, WindowCosts

__all__ = ["NICE", "ReplanWorker"]

NICE = 5
"""How much lower the solver process's CPU priority is than the rank's."""


class ReplanWorker:
    """One re-plan at a time, in a child process; `done()` polls, `result()` collects."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._answer: list[ReplanOutcome | str] = []
        self._hello: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self) -> None:
        """Start the child now (Python and imports), not at the first re-plan; `ready` says when
        it can take one."""
        if self._proc is None or self._proc.poll() is not None:
            root = str(Path(__file__).resolve().parents[1])  # where `freezeopt` imports from
            path = os.environ.get("PYTHONPATH")
            env = {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}
            self._proc = procs.start(  # its own process group, dying with this thread
                [sys.executable, "-m", "freezeopt.training.replan_worker", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
            )
            self._ready = ready = threading.Event()
            stdout = self._proc.stdout
            assert stdout is not None

            def hello() -> None:  # the child's first message: imports done, passes loaded
                with contextlib.suppress(OSError, EOFError, pickle.UnpicklingError):
                    if pickle.load(stdout) == ("ready", None):
                        ready.set()

            self._hello = threading.Thread(target=hello, name="freezeopt-replan-hello", daemon=True)
            self._hello.start()

    def ready(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for the started child to finish starting; True once it
        has (imports done, compiled passes loaded), False if not yet or if it died first."""
        return self._ready.wait(timeout)

    def submit(
        self,
        spec: ReplanSpec,
        current: Schedule,
        measured: Mapping[str, float],
        *,
        step: int,
        reason: str,
        delay_s: float = 0.0,
        costs: WindowCosts | None = None,
    ) -> None:
        """Start solving; the previous re-plan must have been collected. `delay_s`: the child
        waits that long first (the test-only `slow_replan` fault); `costs`: a full-update
        window's loss costs (`freezeopt.training.replan.replan`)."""
        assert not self.running(), "collect the running re-plan first"
        self.start()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        box: list[ReplanOutcome | str] = []
        self._answer = box
        request = (spec, current, dict(measured), step, reason, delay_s, costs)
        stdin, stdout, hello = proc.stdin, proc.stdout, self._hello
        assert hello is not None

        def talk() -> None:  # blocking pipe I/O, off the training thread (it releases the GIL)
            try:
                pickle.dump(request, stdin, protocol=pickle.HIGHEST_PROTOCOL)
                stdin.flush()
                hello.join()  # the child's "ready" comes first on its stdout
                kind, value = pickle.load(stdout)
                box.append(value if kind == "ok" else str(value))
            except (OSError, EOFError, pickle.UnpicklingError) as e:
                code = proc.poll()
                box.append(f"the re-plan solver process ended (exit {code}): {type(e).__name__}")

        self._reader = threading.Thread(target=talk, name="freezeopt-replan-io", daemon=True)
        self._reader.start()

    def running(self) -> bool:
        """True while a submitted re-plan has not been collected."""
        return self._reader is not None

    def done(self) -> bool:
        """True when the submitted re-plan has an answer (or failed)."""
        return self._reader is not None and bool(self._answer)

    def wait(self) -> None:
        """Block until the submitted re-plan has an answer (each solve is time-limited)."""
        if self._reader is not None:
            self._reader.join()

    def result(self) -> ReplanOutcome | str:
        """The finished re-plan's outcome, or its error as one line; clears it for the next."""
        assert self._reader is not None and self._answer
        self._reader.join()
        self._reader = None
        out = self._answer[0]
        if isinstance(out, str) and self._proc is not None and self._proc.poll() is not None:
            procs.stop(self._proc)  # it died: the next re-plan starts a new one
            self._proc = None
        return out

    def close(self) -> None:
        """Wait for a re-plan still solving (each is time-limited), then end the child."""
        if self._reader is not None:
            self._reader.join()
            self._reader = None
        if self._proc is not None:
            with contextlib.suppress(OSError):
                assert self._proc.stdin is not None
                self._proc.stdin.close()  # end of requests: the child exits
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=30)
            procs.stop(self._proc)  # kills its group if it is still running
            self._proc = None


def _serve(parent: int, requests: IO[bytes], answers: IO[bytes]) -> None:
    """The child: answer pickled re-plan requests until stdin closes."""
    from freezeopt.solver import load_kernels
    from freezeopt.solver.lp_arrays import LpCache
    from freezeopt.training.replan import replan

    procs.die_with_parent(parent)  # set at its start on Linux; elsewhere a thread polls
    with contextlib.suppress(OSError):
        os.nice(NICE)
    # numba's kernels before the first re-plan (at low priority it could take seconds then): the
    # relaxation's and the search's too, for a re-plan that cannot fit the LP
    load_kernels()
    cache = LpCache()
    pickle.dump(("ready", None), answers, protocol=pickle.HIGHEST_PROTOCOL)
    answers.flush()
    while True:
        try:
            spec, current, measured, step, reason, delay_s, costs = pickle.load(requests)
        except EOFError:
            return
        time.sleep(delay_s)
        answer: tuple[str, Any]
        try:
            answer = (
                "ok",
                replan(
                    spec,
                    current,
                    measured,
                    step=step,
                    reason=reason,
                    lp_cache=cache,
                    costs=costs,
                ),
            )
        except Exception as e:
            answer = ("error", f"{type(e).__name__}: {e}".splitlines()[0])
        pickle.dump(answer, answers, protocol=pickle.HIGHEST_PROTOCOL)
        answers.flush()


if __name__ == "__main__":
    # answers go to the original stdout; anything else printed goes to stderr (the rank's log)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(int(sys.argv[1]), sys.stdin.buffer, out)
