"""The solver: from a schedule's DAG and its signal model to what to freeze where, and its file.

Public: `solve` with `SolveOptions` → `SolveResult`; `solve_ttq`, the budget with the least
predicted time to quality (`ttq`); `FreezeProblem`, the problem every strategy
takes; `schedule_from_result`, the answer as a schedule file; `LpCache`, for re-solving warm;
`load_kernels`, to compile before a clock starts; `MODES`, `SOLVERS`, `Mode`, `SolverName`.
Everything else is private to the package: the problem (`problem`), how the time limit is
shared (`time_limits`), the orchestration (`solve`), the PuLP model (`pulp_model`, run by
`pulp_run` and `highs_child`), the LP as arrays (`lp_arrays`), the heuristic's search (`search`),
LP dives and rounding (`dive`), and the answer without the LP (`balance`, `relax`,
`relax_kernels`).
"""

from freezeopt.solver.export import schedule_from_result
from freezeopt.solver.lp_arrays import LpCache
from freezeopt.solver.modes import load_kernels, solve
from freezeopt.solver.problem import (
    MODES,
    SOLVERS,
    FreezeProblem,
    Mode,
    SolveOptions,
    SolveResult,
    SolverName,
)
from freezeopt.solver.ttq import solve_ttq

__all__ = [
    "MODES",
    "SOLVERS",
    "FreezeProblem",
    "LpCache",
    "Mode",
    "SolveOptions",
    "SolveResult",
    "SolverName",
    "load_kernels",
    "schedule_from_result",
    "solve",
    "solve_ttq",
]
