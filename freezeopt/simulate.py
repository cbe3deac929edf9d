"""Timing a pipeline schedule: list scheduling on the DAG, the critical path, and a Gantt chart.

Given any choice of durations (nothing frozen, all frozen, or a solved schedule), every rank runs
its actions in program order, each as soon as the rank is free and its inputs have arrived. With
program order in the DAG that is a longest-path computation in topological order. The critical
path is the chain of actions and waits that decides the step time; only freezing work on it
shortens the step.

`Timer` holds the DAG as flat lists, for callers that re-time one schedule thousands of times (the
heuristic's search); `simulate` times it once and returns a `Timeline`. Both apply the same rules,
because `simulate` is `Timer.run`: an action waiting on several inputs records the first in-edge
that is latest (ties go to the first), and the critical path ends at the first latest-ending action.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from freezeopt.actions import Action
from freezeopt.dag import PipelineDag

__all__ = ["Timeline", "Timer", "simulate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Start and end of every action (ms from step start), the step time and a critical path."""

    start: Mapping[Action, float]
    end: Mapping[Action, float]
    makespan: float
    critical_path: tuple[Action, ...]


class Timer:
    """Longest paths over one DAG as flat lists, indexed by position in `dag.order`: about four
    times faster per timing than walking networkx's adjacency each time."""

    def __init__(self, dag: PipelineDag):
        self.order = dag.order
        self.idx = {a: i for i, a in enumerate(dag.order)}
        self.preds = [
            [(self.idx[u], float(at["lag"])) for u, at in dag.graph.pred[v].items()]
            for v in dag.order
        ]
        self.base = [dag.cost[a] for a in dag.order]
        self.gcost = dag.group_cost
        self._graph = dag.graph
        self._succs: list[list[tuple[int, float]]] | None = None

    def durations(self, plan: Mapping[tuple[Action, int], float]) -> list[float]:
        """Each action's duration with group `g` of action `a` frozen to the extent `plan[(a, g)]`."""
        d = list(self.base)
        for (a, g), x in plan.items():
            d[self.idx[a]] -= self.gcost[a.stage][g] * x
        return d

    def run(self, d: list[float]) -> tuple[float, list[float], list[Action]]:
        """Step time, each action's end, and the critical path (actions in order)."""
        span, _, end, path = self._run(d)
        return span, end, [self.order[i] for i in path]

    def _run(self, d: list[float]) -> tuple[float, list[float], list[float], list[int]]:
        """Step time, starts, ends, and the critical path as positions in `order`."""
        n = len(d)
        start = [0.0] * n
        end = [0.0] * n
        tight = [-1] * n
        for v in range(n):
            t, arg = 0.0, -1
            for u, lag in self.preds[v]:
                ready = end[u] + lag
                if ready > t or (arg < 0 and ready == t and ready > 0):
                    t, arg = ready, u
            start[v] = t
            end[v] = t + d[v]
            tight[v] = arg
        if not n:
            return 0.0, start, end, []
        span = max(end)
        v = end.index(span)  # the first of the latest-ending actions
        path = [v]
        while tight[v] >= 0:
            v = tight[v]
            path.append(v)
        return span, start, end, path[::-1]

    def slack(self, d: list[float], end: list[float], span: float) -> list[float]:
        """How much longer each action could run without lengthening the step (total float)."""
        if self._succs is None:
            self._succs = [
                [(self.idx[w], float(at["lag"])) for w, at in self._graph.succ[v].items()]
                for v in self.order
            ]
        succs = self._succs
        n = len(d)
        latest = [0.0] * n
        out = [0.0] * n
        for v in range(n - 1, -1, -1):
            le = span
            for w, lag in succs[v]:
                le = min(le, latest[w] - d[w] - lag)
            latest[v] = le
            out[v] = le - end[v]
        return out


def simulate(dag: PipelineDag, durations: Mapping[Action, float] | None = None) -> Timeline:
    """List-schedule `dag` with `durations` (default: the profiled costs)."""
    timer = Timer(dag)
    src = dag.cost if durations is None else durations
    d = [src[a] for a in dag.order]
    span, start, end, path = timer._run(d)
    order = dag.order
    return Timeline(
        start=dict(zip(order, start, strict=True)),
        end=dict(zip(order, end, strict=True)),
        makespan=span,
        critical_path=tuple(order[i] for i in path),
    )
