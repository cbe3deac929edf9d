"""The re-plan solver process: the same answers as `replan` in-process, a warm LP kept across a
run's re-plans, one-line errors, a new process after one dies, and nothing left running."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.procs import alive
from freezeopt.formats.profile import profile_sha256, save_profile
from freezeopt.model.dag import build_dag
from freezeopt.profiling.synth import SynthOptions, synth_profile
from freezeopt.training.replan import ReplanOutcome, ReplanSpec, replan
from freezeopt.training.replan_worker import ReplanWorker


def _problem(tmp_path: Path) -> tuple[ReplanSpec, Any, dict[str, float]]:
    from freezeopt.commands import solve_file
    from freezeopt.formats.schedule import Drift, Phases
    from freezeopt.solver import SolveOptions

    prof = synth_profile(SynthOptions(schedule="1F1B", ranks=4, microbatches=8, groups=3))
    path = tmp_path / "p.json"
    save_profile(prof, path)
    phases = Phases(warmup_steps=0, full_update_every=0, drift=Drift(step_time_error=1e6))
    _, sched = solve_file(path, SolveOptions(mode="heuristic", budget=0.1), phases=phases, out=None)
    spec = ReplanSpec(profile=prof, profile_sha256=profile_sha256(prof), every=5)
    dag = build_dag(prof)
    measured = {str(a): c * (1.3 if a.stage == 2 else 1.0) for a, c in dag.cost.items()}
    return spec, sched, measured


def _wait(w: ReplanWorker, timeout: float = 120) -> ReplanOutcome | str:
    deadline = time.monotonic() + timeout
    while not w.done():
        assert time.monotonic() < deadline, "the re-plan did not finish"
        time.sleep(0.02)
    return w.result()


def test_worker_answers_as_replan_does_and_keeps_the_lp_warm(tmp_path: Path) -> None:
    spec, sched, measured = _problem(tmp_path)
    w = ReplanWorker()
    try:
        w.start()
        child = w._proc
        assert child is not None and child.pid != os.getpid()
        assert w.ready(timeout=120)  # it says when its imports and compiled passes are loaded
        w.submit(spec, sched, measured, step=5, reason="every")
        assert w.running()
        first = _wait(w)
        assert isinstance(first, ReplanOutcome) and not w.running()
        here = replan(spec, sched, measured, step=5, reason="every")
        assert first.text == here.text  # same plan, same file, byte for byte
        assert first.new_predicted_ms == here.new_predicted_ms and first.warm is False
        w.submit(spec, sched, measured, step=10, reason="every")
        again = _wait(w)
        assert isinstance(again, ReplanOutcome) and again.warm is True  # the child kept its LP
        assert w._proc is child  # one process for the run
    finally:
        w.close()
    assert not alive([child.pid])


def test_worker_errors_are_one_line_and_a_dead_child_is_replaced(tmp_path: Path) -> None:
    spec, sched, measured = _problem(tmp_path)
    w = ReplanWorker()
    try:
        other = synth_profile(SynthOptions(schedule="1F1B", ranks=2, microbatches=8, groups=3))
        wrong = ReplanSpec(profile=other, profile_sha256=profile_sha256(other), every=5)
        w.submit(wrong, sched, measured, step=5, reason="every")  # another pipeline's profile
        err = _wait(w)
        assert (
            isinstance(err, str)
            and "\n" not in err
            and err.startswith("MismatchError: profile sha256 ")
        )
        first = w._proc
        assert first is not None and first.poll() is None  # a user error leaves the child serving
        os.kill(first.pid, signal.SIGKILL)  # as if it died in a solve:
        first.wait()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(w, "start", lambda: None)  # (submit would start a new child first)
            w.submit(spec, sched, measured, step=10, reason="every")
            died = _wait(w)
        assert isinstance(died, str) and "solver process ended (exit -9)" in died
        w.submit(spec, sched, measured, step=15, reason="every")
        ok = _wait(w)
        assert isinstance(ok, ReplanOutcome) and ok.warm is False  # a new child, a cold LP
        assert w._proc is not None and w._proc.pid != first.pid
    finally:
        w.close()


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="needs os.getpriority")
def test_worker_runs_at_lower_priority() -> None:
    from freezeopt.training.replan_worker import NICE

    w = ReplanWorker()
    try:
        w.start()
        assert w._proc is not None
        deadline = time.monotonic() + 120  # it lowers itself once its imports are done
        want = min(19, os.getpriority(os.PRIO_PROCESS, 0) + NICE)
        while os.getpriority(os.PRIO_PROCESS, w._proc.pid) != want:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        w.close()


def test_the_child_loads_the_compiled_passes_before_it_says_ready() -> None:
    """`_serve` (the child's body) loads the simulator's, the relaxation's and the search's numba
    passes before its first message, so a re-plan that answers without the LP does not pay for
    loading them (about 0.5 s from numba's cache, seconds to compile) inside its time limit. Run in
    a process of its own (the child lowers its priority), with no requests: it says ready and
    returns."""
    import subprocess
    import sys

    code = """
import io, os, pickle, sys
import freezeopt.solver.relax as relax, freezeopt.model.simulate as simulate, freezeopt.solver.search as search
from freezeopt.training.replan_worker import _serve
out = io.BytesIO()
_serve(os.getppid(), io.BytesIO(b""), out)
out.seek(0)
first = pickle.load(out)
kernels = (*simulate._passes(), *relax._passes()[:5], search._donor_pass())  # softplus: inside them
loaded = [len(f.signatures) > 0 for f in kernels]
print(first[0], len(loaded), all(loaded))
"""
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["ready", "9", "True"]
