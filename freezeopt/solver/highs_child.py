"""A HiGHS MIP solved in a child process that is stopped at a deadline.

What: `solve_mip_until` writes a `highspy.Highs` model (a MIP) as MPS, solves it in
`python -m freezeopt.solver.highs_child` from a MIP start with HiGHS's own time limit, and kills the child
if it is still running at the deadline. Why: HiGHS checks its time limit, and calls its interrupt
callbacks, only between steps of a MIP's root node. At 1F1B 16×64 with 8 groups the first step of
`milp`'s phase 2 (presolve and the root LP for the signal objective) takes about 9 s, so phase 2
solved in-process ran 5 s past `--time-limit` (benchmarks/solver.md, run J). Writing that model
(2.4 MB) and starting the child take about 0.2 s. The child and its files go with the solve
however it ends (`freezeopt.procs`).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from freezeopt import procs

__all__ = ["STOPPED", "solve_mip_until"]

STOPPED = "stopped at the time limit"
"""Status when the child was killed at the deadline (no answer)."""
MARGIN = 0.25
"""Seconds before the deadline at which the child's own HiGHS time limit falls, so that a solve
that stops on it still writes its incumbent back before the kill."""


def solve_mip_until(
    h: Any, start: list[float], deadline: float, *, gap: float, threads: int
) -> tuple[str, np.ndarray | None]:
    """Solve the MIP in `h` from `start` until `deadline` (`time.perf_counter()` seconds). Returns
    HiGHS's model status as text (`Optimal`, `Time limit reached`, …; `STOPPED` when killed) and
    the column values, or None without a solution."""
    with procs.scratch("mip") as d:
        h.writeModel(str(d / "model.mps"))
        np.save(d / "start.npy", np.asarray(start, dtype=float))
        left = deadline - time.perf_counter()
        cmd = [
            sys.executable,
            "-m",
            "freezeopt.solver.highs_child",
            str(d),
            repr(time.time() + left - MARGIN),  # wall clock: the child's clocks are its own
            repr(gap),
            str(threads),
        ]
        # its own process group, killed on leaving (an answer, the deadline, an error, a signal)
        with procs.child(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as proc:
            try:
                proc.wait(timeout=max(left, 0.0))
            except subprocess.TimeoutExpired:
                return STOPPED, None
        status_file = d / "status.txt"
        if proc.returncode != 0 or not status_file.exists():
            return f"child exited with {proc.returncode}", None
        status = status_file.read_text()
        values = d / "x.npy"
        return status, (np.load(values) if values.exists() else None)


def _main(folder: str, stop_at: str, gap: str, threads: str) -> None:
    import highspy

    d = Path(folder)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.readModel(str(d / "model.mps"))
    h.setOptionValue("time_limit", max(float(stop_at) - time.time(), 0.01))
    h.setOptionValue("mip_rel_gap", float(gap))
    h.setOptionValue("threads", int(threads))
    sol = highspy.HighsSolution()
    sol.col_value = np.load(d / "start.npy").tolist()
    sol.value_valid = True
    h.setSolution(sol)
    h.run()
    if h.getInfo().primal_solution_status == 2:  # feasible
        np.save(d / "x.npy", np.asarray(h.getSolution().col_value))
    (d / "status.txt").write_text(h.modelStatusToString(h.getModelStatus()))


if __name__ == "__main__":
    _main(*sys.argv[1:])
