"""A HiGHS MIP solved in a child process (freezeopt.highs_child) answers as in-process HiGHS does,
and is stopped at its deadline."""

from __future__ import annotations

import time

import highspy
import numpy as np
import pytest

from freezeopt.highs_child import STOPPED, solve_mip_until


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
    assert (status, x) == (STOPPED, None)
    assert time.perf_counter() - t0 < 5
