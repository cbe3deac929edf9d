"""Timing a pipeline schedule: list scheduling on the DAG, the critical path, and a Gantt chart.

Given any choice of durations (nothing frozen, all frozen, or a solved schedule), every rank runs
its actions in program order, each as soon as the rank is free and its inputs have arrived. With
program order in the DAG that is a longest-path computation in topological order. The critical
path is the chain of actions and waits that decides the step time; only freezing work on it
shortens the step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from freezeopt.actions import Action
from freezeopt.dag import PipelineDag

__all__ = ["Timeline", "simulate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Start and end of every action (ms from step start), the step time and a critical path."""

    start: Mapping[Action, float]
    end: Mapping[Action, float]
    makespan: float
    critical_path: tuple[Action, ...]


def simulate(dag: PipelineDag, durations: Mapping[Action, float] | None = None) -> Timeline:
    """List-schedule `dag` with `durations` (default: the profiled costs)."""
    d = dag.cost if durations is None else durations
    g = dag.graph
    start: dict[Action, float] = {}
    end: dict[Action, float] = {}
    tight: dict[Action, Action | None] = {}
    for v in dag.order:
        t, arg = 0.0, None
        for u, attrs in g.pred[v].items():
            ready = end[u] + attrs["lag"]
            if ready > t or (arg is None and ready == t and ready > 0):
                t, arg = ready, u
        start[v] = t
        end[v] = t + d[v]
        tight[v] = arg
    if not end:
        return Timeline(start={}, end={}, makespan=0.0, critical_path=())
    last = max(dag.order, key=end.__getitem__)  # first of the latest-ending actions
    path = [last]
    while (p := tight[path[-1]]) is not None:
        path.append(p)
    return Timeline(start=start, end=end, makespan=end[last], critical_path=tuple(reversed(path)))
