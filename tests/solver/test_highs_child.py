"""A HiGHS MIP solved in a child process (freezeopt.solver.highs_child) answers as in-process HiGHS does,
and is stopped at its deadline."""

from __future__ import annotations

import time

import highspy
import numpy as np
import pytest

from freezeopt.solver import highs_child
from freezeopt.solver.highs_child import STOPPED, solve_mip_until


def _knapsack(n: int, seed: int) -> highspy.Highs:
    """max Σ v·x s.t. Σ w·x ≤ W, x binary (as a minimisation), with x = 0 as the start."""
    rng = np.random.default_rng(seed)
    v, w = rng.integers(5, 50, n).astype(float), rng.integers(3, 30, n).astype(float)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    inf = highspy.kHighsInf
    for j in range(n):
        h.addVar(0.0, 1.0)
        h.changeColCost(j, -v[j])
        h.changeColIntegrality(j, highspy.HighsVarType.kInteger)
    h.addRow(-inf, float(w.sum() / 3), n, np.arange(n, dtype=np.int32), w)
    return h


@pytest.mark.parametrize("seed", range(3))
def test_child_solves_as_in_process_highs_does(seed: int) -> None:
    h = _knapsack(30, seed)
    status, x = solve_mip_until(h, [0.0] * 30, time.perf_counter() + 60, gap=0.0, threads=1)
    assert status == "Optimal" and x is not None
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    cost = np.array(h.getLp().col_cost_)
    assert float(cost @ x) == pytest.approx(h.getInfo().objective_function_value, abs=1e-6)
    assert set(np.round(x, 9)) <= {0.0, 1.0}


def test_child_is_stopped_at_the_deadline() -> None:
    t0 = time.perf_counter()
    status, x = solve_mip_until(_knapsack(30, 0), [0.0] * 30, t0, gap=0.0, threads=1)
    assert (status, x) == (STOPPED, None)  # a solved knapsack would say Optimal


def _market_split(m: int, n: int, seed: int) -> tuple[highspy.Highs, list[float]]:
    """Cornuéjols–Dawande market split with slacks: min Σ|a_i·x − b_i|, x binary, hard to prove
    optimal for branch and bound; x = 0 with slacks b is a feasible start."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 100, (m, n)).astype(float)
    b = np.floor(a.sum(axis=1) / 2)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    for j in range(n):
        h.addVar(0.0, 1.0)
        h.changeColIntegrality(j, highspy.HighsVarType.kInteger)
    for _ in range(2 * m):  # s⁺_i, s⁻_i
        h.addVar(0.0, highspy.kHighsInf)
        h.changeColCost(h.getNumCol() - 1, 1.0)
    for i in range(m):
        idx = np.array([*range(n), n + 2 * i, n + 2 * i + 1], dtype=np.int32)
        val = np.array([*a[i], 1.0, -1.0])
        h.addRow(b[i], b[i], len(idx), idx, val)
    start = [0.0] * n + [v for i in range(m) for v in (b[i], 0.0)]
    return h, start


def test_child_that_stops_on_its_own_time_limit_hands_back_its_incumbent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child's HiGHS time limit falls `MARGIN` before the deadline, so a solve that runs out
    of time still returns the best plan it has (here at least the start) instead of being killed.
    Wide margins, so that a loaded host still starts the child and its HiGHS well before its limit
    and writes the answer back well before the kill."""
    monkeypatch.setattr(highs_child, "MARGIN", 4.0)
    h, start = _market_split(4, 40, 0)
    status, x = solve_mip_until(h, start, time.perf_counter() + 8.0, gap=0.0, threads=1)
    assert status == "Time limit reached", status
    assert x is not None and len(x) == h.getNumCol()
