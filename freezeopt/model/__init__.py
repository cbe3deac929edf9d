"""The schedule as a graph, its timing, and what freezing costs in progress: no torch, no solver.

Public: `PipelineDag` and `build_dag` (a profile's actions and their precedence, networkx) and
`schedule_plan` (a schedule file's freezing over that DAG), in `freezeopt.model.dag`; `Timeline`
and the array `Timer` (list-scheduling, compiled with numba) from `freezeopt.model.simulate`,
whose `simulate` function is not re-exported here (it would hide the module); `estimate_signal`
and the estimators (`freezeopt.model.sensitivity`); `freezeopt.model.timelines` (predicted beside
measured steps). `freezeopt.model.plot` draws Gantt charts; it loads matplotlib, so it is not
imported here.
"""

from freezeopt.model.dag import PipelineDag, build_dag, schedule_plan
from freezeopt.model.sensitivity import ESTIMATORS, Estimator, GroupSignal, estimate_signal
from freezeopt.model.simulate import Timeline, Timer

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "GroupSignal",
    "PipelineDag",
    "Timeline",
    "Timer",
    "build_dag",
    "estimate_signal",
    "schedule_plan",
]
