"""TimelyFreeze's LP, rebuilt the way its authors build it: a baseline to compare against.

TimelyFreeze (arXiv 2602.05754) gives every action a start time `t_i` and a duration `d_i` in
`[w_min_i, w_max_i]` (nothing frozen … everything freezable frozen), requires `t_u + d_u ≤ t_v`
along the DAG and `T ≥ t_i + d_i`, caps each stage's mean freeze ratio
`r_i = (w_max_i − d_i)/(w_max_i − w_min_i)` at 0.9, and minimises the big-M objective
`999999·T − Σ d_i/(w_max_i − w_min_i)`: makespan first, then least freezing. Its code fills a
*dense* constraint matrix (numpy) and hands it to HiGHS through SciPy; we do the same (numpy
dense rows, then HiGHS through highspy) so benchmarks measure its memory and time honestly and
tests can check our sparse two-phase LP against an independent formulation. Edge lags, which
TimelyFreeze ignores, are included so the two models describe the same pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from freezeopt.actions import Action
from freezeopt.errors import SolverError
from freezeopt.fileio import stdout_to_stderr
from freezeopt.model.dag import PipelineDag
from freezeopt.solver.lp_arrays import quiet_highs

__all__ = ["BIG_M", "TimelyFreezeLP", "solve_timelyfreeze_lp"]

BIG_M = 999999.0


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelyFreezeLP:
    """The solution of TimelyFreeze's LP."""

    makespan: float
    ratios: dict[Action, float]
    """Freeze ratio r_i of every freezable action."""
    n_rows: int
    n_cols: int
    dense_bytes: int
    """Size of the dense constraint matrix it built."""


def solve_timelyfreeze_lp(dag: PipelineDag, *, stage_cap: float = 0.9) -> TimelyFreezeLP:
    """Build TimelyFreeze's dense LP for `dag` (all of a stage's groups freeze together) and solve it."""
    import highspy

    acts = list(dag.order)
    n = len(acts)
    idx = {a: i for i, a in enumerate(acts)}
    w_max = np.array([dag.cost[a] for a in acts])
    freezable = {a for a in dag.freezable()}
    w_min = np.array(
        [dag.cost[a] - (sum(dag.group_cost[a.stage]) if a in freezable else 0.0) for a in acts]
    )
    span = w_max - w_min
    edges = list(dag.graph.edges(data="lag"))
    stages = sorted({a.stage for a in freezable})
    n_cols = 2 * n + 1  # t, d, T
    n_rows = len(edges) + n + len(stages)
    a_ub = np.zeros((n_rows, n_cols))  # dense, as TimelyFreeze builds it
    b_ub = np.zeros(n_rows)
    row = 0
    for u, v, lag in edges:
        a_ub[row, idx[u]] = 1.0
        a_ub[row, n + idx[u]] = 1.0
        a_ub[row, idx[v]] = -1.0
        b_ub[row] = -lag
        row += 1
    for i in range(n):
        a_ub[row, i] = 1.0
        a_ub[row, n + i] = 1.0
        a_ub[row, 2 * n] = -1.0
        row += 1
    for s in stages:
        members = [idx[a] for a in acts if a in freezable and a.stage == s]
        # Σ (w_max − d)/span ≤ cap·n  ⇔  −Σ d/span ≤ cap·n − Σ w_max/span
        for i in members:
            a_ub[row, n + i] = -1.0 / span[i]
        b_ub[row] = stage_cap * len(members) - sum(w_max[i] / span[i] for i in members)
        row += 1
    cost = np.zeros(n_cols)
    cost[2 * n] = BIG_M
    for a in freezable:
        cost[n + idx[a]] = -1.0 / span[idx[a]]
    lower = np.concatenate([np.zeros(n), w_min, [0.0]])
    upper = np.concatenate([np.full(n, highspy.kHighsInf), w_max, [highspy.kHighsInf]])

    rows_nz, cols_nz = np.nonzero(a_ub.T)  # column-wise: for each column, its rows
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = n_cols, n_rows
    lp.col_cost_ = cost
    lp.col_lower_, lp.col_upper_ = lower, upper
    lp.row_lower_ = np.full(n_rows, -highspy.kHighsInf)
    lp.row_upper_ = b_ub
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(rows_nz, np.arange(n_cols + 1)).astype(np.int32)
    lp.a_matrix_.index_ = cols_nz.astype(np.int32)
    lp.a_matrix_.value_ = a_ub.T[rows_nz, cols_nz]
    h = quiet_highs(1)
    with stdout_to_stderr():
        h.passModel(lp)
        h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise SolverError(
            f"TimelyFreeze LP: HiGHS returned {h.modelStatusToString(h.getModelStatus())}"
        )
    x = np.array(h.getSolution().col_value)
    ratios = {a: float((w_max[idx[a]] - x[n + idx[a]]) / span[idx[a]]) for a in freezable}
    return TimelyFreezeLP(
        makespan=float(x[2 * n]),
        ratios=ratios,
        n_rows=n_rows,
        n_cols=n_cols,
        dense_bytes=int(a_ub.nbytes),
    )
