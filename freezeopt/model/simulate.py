"""Timing a pipeline schedule: list scheduling on the DAG and the critical path (`freezeopt.model.plot`
draws the Gantt chart from its timeline).

Given any choice of durations (nothing frozen, all frozen, or a solved schedule), every rank runs
its actions in program order, each as soon as the rank is free and its inputs have arrived. With
program order in the DAG that is a longest-path computation in topological order. The critical
path is the chain of actions and waits that decides the step time; only freezing work on it
shortens the step.

`Timer` holds the DAG as arrays, for callers that re-time one schedule thousands of times (the
heuristic's search); `simulate` times it once and returns a `Timeline`. Both run the same
compiled passes (numba; compiled once per machine, then loaded from its cache beside the package
or, where that is read-only, in the user's cache folder; with neither, compiled in each process):
forward, each action's start, end and the in-edge that set its start (ties go to the first in-edge
that is latest); backward, each action's slack; and the walk back from the first latest-ending
action along those in-edges, the critical path.
Compiled because the heuristic's search re-times the DAG thousands of times: in Python the passes
took most of its time (at 1F1B 32×128 its search ran 13.4 s in Python, 4.3 s compiled, with the
same plan; 0.85 s once the search itself kept its plans in arrays).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from freezeopt.actions import Action
from freezeopt.model.dag import PipelineDag

__all__ = ["Timeline", "Timer", "load_passes", "rank_prefix", "simulate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Start and end of every action (ms from step start), the step time and a critical path."""

    start: Mapping[Action, float]
    end: Mapping[Action, float]
    makespan: float
    critical_path: tuple[Action, ...]


def jit(fn: Any) -> Any:
    """`fn` compiled by numba and cached on disk (numba imported here, on first use, not with
    freezeopt: most commands never time a DAG). The relaxation's kernels use it too."""
    from numba import njit

    try:
        return njit(cache=True)(fn)
    except RuntimeError:  # nowhere to write the cache (read-only install and home): compile
        return njit(fn)  # in each process instead, about a second


@functools.cache
def _passes() -> tuple[Any, Any, Any]:
    """The compiled forward and backward passes, and the walk back along the critical path."""

    @jit
    def forward(d, ptr, src, lag):
        n = d.shape[0]
        start = np.zeros(n)
        end = np.zeros(n)
        tight = np.full(n, -1, np.int64)
        for v in range(n):
            t = 0.0
            arg = -1
            for j in range(ptr[v], ptr[v + 1]):
                u = src[j]
                ready = end[u] + lag[j]
                if ready > t or (arg < 0 and ready == t and ready > 0):
                    t = ready
                    arg = u
            start[v] = t
            end[v] = t + d[v]
            tight[v] = arg
        return start, end, tight

    @jit
    def backward(d, end, span, ptr, dst, lag):
        n = d.shape[0]
        latest = np.zeros(n)
        out = np.zeros(n)
        for v in range(n - 1, -1, -1):
            le = span
            for j in range(ptr[v], ptr[v + 1]):
                w = dst[j]
                x = latest[w] - d[w] - lag[j]
                if x < le:
                    le = x
            latest[v] = le
            out[v] = le - end[v]
        return out

    @jit
    def walk(end, tight):
        # from the first latest-ending action back along the in-edges that set each start; the
        # path in order (in Python this walk took half of a re-timing at 64×256)
        v = np.argmax(end)
        n = 1
        u = v
        while tight[u] >= 0:
            u = tight[u]
            n += 1
        path = np.empty(n, np.int64)
        for i in range(n - 1, -1, -1):
            path[i] = v
            v = tight[v]
        return path

    return forward, backward, walk


def load_passes() -> None:
    """Import numba and load (the first time on a machine: compile) the passes now, so a
    process that will time DAGs later pays for it before it is in a hurry (about 0.3 s)."""
    forward, backward, walk = _passes()
    d, ptr, none, lag = np.ones(1), np.zeros(2, dtype=np.int64), np.zeros(0, np.int64), np.zeros(0)
    _, end, tight = forward(d, ptr, none, lag)
    backward(d, end, float(end[0]), ptr, none, lag)
    walk(end, tight)


def _in_edges(dag: PipelineDag, idx: Mapping[Action, int]) -> tuple[np.ndarray, ...]:
    """Each action's in-edges as CSR arrays (pointer, source position, lag), in `dag.order` and,
    per action, in the graph's own order of its predecessors. Reads networkx's adjacency dicts
    (`DiGraph._pred`, the structure its docs give subclasses) instead of building a view per
    action: 0.1 s instead of 0.25 s at 32 k actions."""
    pred = dag.graph._pred
    rows = [pred[v] for v in dag.order]
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)), out=ptr[1:])
    m = int(ptr[-1])
    src = np.fromiter((idx[u] for r in rows for u in r), dtype=np.int64, count=m)
    lag = np.fromiter((at["lag"] for r in rows for at in r.values()), dtype=float, count=m)
    return ptr, src, lag


class Timer:
    """Longest paths over one DAG, with actions indexed by position in `dag.order`."""

    def __init__(self, dag: PipelineDag):
        self.order = dag.order
        self.idx = {a: i for i, a in enumerate(dag.order)}
        self._pred = _in_edges(dag, self.idx)
        self._succ: tuple[np.ndarray, ...] | None = None
        self.base = np.array([dag.cost[a] for a in dag.order], dtype=float)
        self.gcost = dag.group_cost
        held = np.array([sum(c for c in row if c > 0) for row in dag.group_cost], dtype=float)
        self.dag = dag
        self.floor = self.base.copy()
        """Each action's duration with `dag.all_frozen()` (not clipped at 0)."""
        for a in dag.freezable():
            self.floor[self.idx[a]] -= held[a.stage]
        for a, saved in dag.truncation_saving(dag.all_frozen()).items():
            self.floor[self.idx[a]] -= saved

    def durations(self, plan: Mapping[tuple[Action, int], float]) -> np.ndarray:
        """Each action's duration with group `g` of action `a` frozen to the extent `plan[(a, g)]`
        (and what backward truncation saves under it; not clipped at 0)."""
        d = self.base.copy()
        idx, gcost = self.idx, self.gcost
        for (a, g), x in plan.items():
            d[idx[a]] -= gcost[a.stage][g] * x
        for a, saved in self.dag.truncation_saving(plan).items():
            d[idx[a]] -= saved
        return d

    def times(
        self, d: Sequence[float] | np.ndarray
    ) -> tuple[float, np.ndarray, np.ndarray, list[int]]:
        """Step time, starts, ends, and the critical path as positions in `order`."""
        forward, _, walk = _passes()
        start, end, tight = forward(np.asarray(d, dtype=float), *self._pred)
        if not len(end):
            return 0.0, start, end, []
        path = walk(end, tight)  # from the first of the latest-ending actions
        return float(end[path[-1]]), start, end, path.tolist()

    def run(self, d: Sequence[float] | np.ndarray) -> tuple[float, np.ndarray, list[Action]]:
        """Step time, each action's end, and the critical path (actions in order)."""
        span, _, end, path = self.times(d)
        return span, end, [self.order[i] for i in path]

    def slack(self, d: Sequence[float] | np.ndarray, end: np.ndarray, span: float) -> np.ndarray:
        """How much longer each action could run without lengthening the step (total float)."""
        if self._succ is None:  # the in-edge arrays turned around (a min needs no edge order)
            ptr, src, lag = self._pred
            n = len(self.order)
            by_src = np.argsort(src, kind="stable")
            dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(ptr))
            out_ptr = np.zeros(n + 1, dtype=np.int64)
            out_ptr[1:] = np.cumsum(np.bincount(src, minlength=n))
            self._succ = (out_ptr, dst[by_src], lag[by_src])
        _, backward, _ = _passes()
        return backward(np.asarray(d, dtype=float), end, float(span), *self._succ)


def simulate(dag: PipelineDag, durations: Mapping[Action, float] | None = None) -> Timeline:
    """List-schedule `dag` with `durations` (default: the profiled costs)."""
    src = dag.cost if durations is None else durations
    order = dag.order
    span, start, end, path = Timer(dag).times([src[a] for a in order])
    return Timeline(
        start=dict(zip(order, start.tolist(), strict=True)),
        end=dict(zip(order, end.tolist(), strict=True)),
        makespan=span,
        critical_path=tuple(order[i] for i in path),
    )


def rank_prefix(
    dag: PipelineDag, idx: Mapping[Action, int], dmin: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Per action its rank and program-order position; per rank the prefix sums of `dmin`."""
    n = len(idx)
    rank = np.empty(n, dtype=np.int64)
    pos = np.empty(n, dtype=np.int64)
    pre = []
    for r, acts in enumerate(dag.rank_actions):
        ii = np.array([idx[a] for a in acts], dtype=np.int64)
        rank[ii] = r
        pos[ii] = np.arange(len(ii))
        pre.append(np.concatenate([[0.0], np.cumsum(dmin[ii])]))
    return rank, pos, pre
