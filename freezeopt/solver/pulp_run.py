"""PuLP's two solvers, run with their limits kept: where every PuLP model of `freezeopt.solver.modes` is
solved.

Why its own module: each solver needs care that has nothing to do with the model. CBC checks its
time limit only between steps, so a watchdog stops it (`CbcWatchdog`); PuLP reports "Optimal" when
CBC stops at its time limit with an incumbent, so the status comes from `sol_status` (`run_pulp`);
PuLP's HiGHS ignores initial values, so a MIP start is handed to HiGHS here; and HiGHS keeps one
process-wide thread scheduler, reset before each model. CBC runs as a `freezeopt.procs` child with
its files in a scratch folder (`_Cbc`), so neither outlives the solve, however it ends.
`freezeopt.solver.modes` poses the models and reads the answers; the array-built LP
(`freezeopt.solver.lp_arrays`) talks to highspy directly.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal as signals
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pulp

from freezeopt import procs
from freezeopt.errors import SolverError
from freezeopt.fileio import atomic_write_with, stdout_to_stderr

if TYPE_CHECKING:
    from freezeopt.solver.problem import SolveOptions

__all__ = [
    "CBC_STOP",
    "CbcWatchdog",
    "highs_status",
    "model_paths",
    "pulp_solver",
    "run_pulp",
    "write_pulp_model",
]


def highs_status(h: object) -> str:
    import highspy

    ms = h.getModelStatus()  # type: ignore[attr-defined]
    if ms == highspy.HighsModelStatus.kOptimal:
        return "optimal"
    if ms == highspy.HighsModelStatus.kInfeasible:
        return "infeasible"
    feasible = h.getInfo().primal_solution_status == 2  # type: ignore[attr-defined]
    return "time_limit" if feasible else "no_solution"


def model_paths(path: Path) -> tuple[Path, Path]:
    """Where `--write-model PATH` writes phase 1 and phase 2 (`NAME.phase2.lp` beside it)."""
    p = Path(path)
    return p, p.with_name(f"{p.stem}.phase2{p.suffix or '.lp'}")


def write_pulp_model(prob: pulp.LpProblem, path: Path | None, *, phase: int) -> None:
    """Write a phase's model atomically (`.mps` by its suffix, else LP format)."""
    if path is None:
        return
    p = model_paths(path)[phase - 1]

    def write(tmp: Path) -> None:
        if p.suffix.lower() == ".mps":
            prob.writeMPS(str(tmp))
        else:
            prob.writeLP(str(tmp))

    atomic_write_with(p, write)


CBC_STOP = (0.25, 0.1)
"""`CbcWatchdog`: SIGINT this long before CBC's time limit, SIGKILL this long after it (s)."""


class CbcWatchdog:
    """Stop this process's CBC children at their time limit. CBC checks its limit only between
    steps: a MILP's phases at 1F1B 16×64 with 4 groups ran 6.2 s for 5.2 s and 5.0 s for 4.0 s
    (30 s `milp`, 32.6 s in all). SIGINT makes it stop and write its best solution, which PuLP
    reads — at once in branch and bound (a market-split MILP), but 1.2–2.6 s later in those root
    steps; so SIGKILL follows, and the phase's answer is lost (`killed`). Linux only (`/proc`);
    elsewhere CBC keeps its own timing."""

    def __init__(self, time_limit: float | None):
        self.killed = False
        self._timers: list[threading.Timer] = []
        if time_limit is None or not math.isfinite(time_limit) or not os.path.isdir("/proc"):
            return
        early, late = CBC_STOP
        for at, sig in ((max(0.0, time_limit - early), signals.SIGINT), (time_limit + late, None)):
            t = threading.Timer(at, self._signal, (sig,))
            t.daemon = True
            self._timers.append(t)

    def __enter__(self) -> CbcWatchdog:
        for t in self._timers:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for t in self._timers:
            t.cancel()

    def _signal(self, sig: signals.Signals | None) -> None:
        for pid in _cbc_children():
            with contextlib.suppress(OSError):
                os.kill(pid, sig if sig is not None else signals.SIGKILL)
                self.killed |= sig is None


def _cbc_children() -> list[int]:
    me, out = os.getpid(), []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me and comm.startswith("cbc"):
            out.append(int(pid))
    return out


def pulp_solver(
    opts: SolveOptions, *, time_limit: float | None, warm: bool, barrier: bool = False
) -> pulp.LpSolver:
    if opts.solver == "highs":
        if not pulp.HiGHS().available():
            raise SolverError("HiGHS is not available: pip install highspy, or use --solver cbc")
        import highspy

        # HiGHS keeps one process-wide thread scheduler; an earlier model with another thread count
        # makes the next solve fail ("scheduler has already been initialized"). Start afresh.
        highspy.Highs.resetGlobalScheduler(True)

        class _WarmHiGHS(pulp.HiGHS):
            """PuLP's HiGHS ignores initial values; hand them to HiGHS as a MIP start."""

            def callSolver(self, lp: pulp.LpProblem) -> None:
                if warm:
                    sol = highspy.HighsSolution()
                    sol.col_value = [v.varValue or 0.0 for v in lp.variables()]
                    sol.value_valid = True
                    lp.solverModel.setSolution(sol)
                lp.solverModel.run()

        extra = {"solver": "ipm"} if barrier else {}
        return _WarmHiGHS(
            msg=False, timeLimit=time_limit, gapRel=opts.gap, threads=opts.threads, **extra
        )
    # PuLP 3.3 bundles CBC; its PULP_CBC_CMD wrapper is deprecated, so call the bundled binary
    # through COIN_CMD (the path PuLP 4 keeps), or a `cbc` on PATH.
    from pulp.apis import coin_api

    path = coin_api.PULP_CBC_CMD.pulp_cbc_path
    if not os.access(path, os.X_OK):
        path = coin_api.cbc_path
    solver = _Cbc(
        path=path,
        msg=False,
        timeLimit=time_limit,
        gapRel=opts.gap,
        threads=opts.threads,
        warmStart=warm,
        options=["barrier"] if barrier else [],
    )
    if not solver.available():
        raise SolverError(
            "CBC is not available: install pulp==3.3.2 (it bundles CBC) or use --solver highs"
        )
    return solver


class _Cbc(pulp.COIN_CMD):
    """PuLP's COIN_CMD, with CBC started through `freezeopt.procs.child` (its own process group,
    killed when the solve is left however it is left, and by the kernel if freezeopt is killed)
    and its files in a `freezeopt.procs.scratch` folder removed afterwards (PuLP's own leaves them
    in the temp folder when CBC fails or is stopped). The command line is the one PuLP 3.3's
    `solve_CBC` builds for the options `pulp_solver` passes."""

    def solve_CBC(self, lp: pulp.LpProblem, use_mps: bool = True) -> int:
        if not self.executable(self.path):
            raise pulp.PulpSolverError(f"Pulp: cannot execute {self.path}")
        with procs.scratch("cbc") as d:
            mps, sol, mst = (str(d / f"model.{ext}") for ext in ("mps", "sol", "mst"))
            vs, var_names, con_names, _ = lp.writeMPS(mps, rename=1)
            args = [self.path, mps]
            if lp.sense == pulp.LpMaximize:
                args.append("-max")
            if self.optionsDict.get("warmStart", False):
                self.writesol(mst, lp, vs, var_names, con_names)
                args += ["-mips", mst]
            if self.timeLimit is not None:
                args += ["-sec", f"{self.timeLimit}"]
            for option in self.options + self.getOptions():
                args += f"-{option}".split()
            args += ["-solve" if self.mip else "-initialSolve", "-printingOptions", "all"]
            args += ["-solution", sol]
            out = None if self.msg else subprocess.DEVNULL
            with procs.child(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out) as cbc:
                code = cbc.wait()
            if code != 0 or not os.path.exists(sol):
                said = f"CBC exited with code {code}" if code else "CBC wrote no solution"
                raise pulp.PulpSolverError(said)
            status, values, dj, pi, slacks, sol_status = self.readsol_MPS(
                sol, lp, vs, var_names, con_names
            )
        lp.assignVarsVals(values)
        lp.assignVarsDj(dj)
        lp.assignConsPi(pi)
        lp.assignConsSlack(slacks, activity=True)
        lp.assignStatus(status, sol_status)
        return int(status)


def run_pulp(
    prob: pulp.LpProblem,
    opts: SolveOptions,
    *,
    time_limit: float | None,
    warm: bool,
    barrier: bool = False,
) -> str:
    """Solve; return `optimal`, `time_limit` (feasible, not proven), `infeasible`, `no_solution`
    or (CBC past its limit, `CbcWatchdog`) `killed at the time limit`."""
    solver = pulp_solver(opts, time_limit=time_limit, warm=warm, barrier=barrier)
    watchdog = CbcWatchdog(time_limit if opts.solver == "cbc" else None)
    try:
        with stdout_to_stderr(), watchdog:
            prob.solve(solver)
    except pulp.PulpSolverError as e:
        if watchdog.killed:
            return "killed at the time limit"
        raise SolverError(f"{opts.solver} failed: {str(e).splitlines()[0]}") from None
    # PuLP reports "Optimal" when CBC stops on its time limit with an incumbent: read sol_status.
    if prob.sol_status == pulp.LpSolutionOptimal and prob.status == pulp.LpStatusOptimal:
        return "optimal"
    if prob.sol_status == pulp.LpSolutionIntegerFeasible:
        return "time_limit"
    if prob.status == pulp.LpStatusInfeasible or prob.sol_status == pulp.LpSolutionInfeasible:
        return "infeasible"
    return "no_solution"
