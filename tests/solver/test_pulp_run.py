"""Running PuLP's solvers: CBC stopped at its time limit, its incumbent kept or its run reported killed."""

from __future__ import annotations

import pytest

from freezeopt.solver import SolveOptions


def test_cbc_past_its_time_limit_is_interrupted_and_keeps_its_incumbent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A market-split MILP (hard for branch and bound) with a 30 s CBC time limit: a watchdog
    for 3 s interrupts CBC in branch and bound, and PuLP still reads CBC's best solution; with no
    time to stop (SIGKILL, no SIGINT) the run is reported killed. The signals come seconds in, so
    that a loaded host has started CBC by then, and the SIGKILL after the SIGINT is far off, so
    that a slow write of the solution is not cut."""

    import numpy as np
    import pulp

    from freezeopt.solver import pulp_run as pulp_solvers

    rng = np.random.default_rng(0)
    a = rng.integers(0, 100, (4, 40)).astype(float)
    b = np.floor(a.sum(axis=1) / 2)
    prob = pulp.LpProblem("market_split", pulp.LpMinimize)
    x = [prob.add_variable(f"x{j}", 0, 1, pulp.LpInteger) for j in range(40)]
    over = [prob.add_variable(f"over{i}", 0) for i in range(4)]
    under = [prob.add_variable(f"under{i}", 0) for i in range(4)]
    prob += pulp.lpSum(over) + pulp.lpSum(under)
    for i in range(4):
        row = pulp.lpSum(a[i, j] * x[j] for j in range(40))
        prob += row + under[i] - over[i] == b[i], f"market_{i}"
    cbc = pulp_solvers.pulp_solver(SolveOptions(gap=0.0), time_limit=30.0, warm=False)
    before = _children_cpu()
    monkeypatch.setattr(pulp_solvers, "CBC_STOP", (0.25, 60.0))  # SIGINT at 2.75 s
    with pulp_solvers.CbcWatchdog(3.0) as dog:
        prob.solve(cbc)
    # stopped by the SIGINT, far before its own 30 s (CPU time: a loaded host gives CBC less CPU,
    # never more), and it kept its incumbent
    assert _children_cpu() - before < 15 and not dog.killed
    assert prob.sol_status == pulp.LpSolutionIntegerFeasible
    assert sum(v.value() for v in over + under) >= 0
    monkeypatch.setattr(pulp_solvers, "CBC_STOP", (-100.0, 2.0))  # SIGKILL at 3 s, no SIGINT
    monkeypatch.setattr(pulp_solvers, "pulp_solver", lambda *a, **k: cbc)
    assert pulp_solvers.run_pulp(prob, SolveOptions(), time_limit=1.0, warm=False) == (
        "killed at the time limit"
    )


def _children_cpu() -> float:
    """CPU seconds of this process's ended, reaped children."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
