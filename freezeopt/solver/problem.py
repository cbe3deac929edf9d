"""The freezing problem of one pipeline, as every part of the solver takes it.

`FreezeProblem` is a DAG with its signal model and options, read the way the solver needs them: the
freezable keys `(action, group)` (only weight-gradient work is freezable, and only groups that
cost time), how many microbatches a group may be frozen in (`kmax`), each group's loss curve over
that count, each group's share of its stage's freezable time; and the three questions every
strategy asks of a plan — how long is the step (`makespan`), how much progress does it drop
(`signal_of`), does it keep the budget and caps (`fits`). `KeyIndex` holds the same keys as arrays
for the search, `Deadline` is the clock a search stops at, `SolveOptions` and `SolveResult` are
what a solve is asked and what it answers.

Why its own module: the PuLP model (`freezeopt.solver.pulp_model`), the LP as arrays
(`freezeopt.solver.lp_arrays`), the search, the LP dives, the rank-balanced start and the
first-order relaxation all take one problem the same way, and none of them needs the
orchestration (`freezeopt.solver.modes`), which imports them all.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np

from freezeopt.actions import Action
from freezeopt.errors import InputError, option
from freezeopt.model.dag import PipelineDag
from freezeopt.model.sensitivity import Estimator, GroupSignal
from freezeopt.model.simulate import Timer

__all__ = [
    "MODES",
    "SOLVERS",
    "Deadline",
    "FreezeProblem",
    "Key",
    "KeyIndex",
    "Mode",
    "Signal",
    "SolveOptions",
    "SolveResult",
    "SolverName",
    "Spent",
    "pwl",
]

MAX_THREADS = 1024
"""Solver threads at most (HiGHS and CBC allocate per thread before they look at the count)."""
Mode = Literal["milp", "lp", "heuristic"]
SolverName = Literal["cbc", "highs"]
MODES: tuple[Mode, ...] = ("milp", "lp", "heuristic")
SOLVERS: tuple[SolverName, ...] = ("cbc", "highs")
Key = tuple[Action, int]
"""A freezable unit: (weight-gradient action, group index within its stage)."""
Signal = tuple[tuple[GroupSignal, ...], ...]
"""Per stage, per group: what freezing the group costs in progress (`freezeopt.model.sensitivity`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveOptions:
    """How to solve."""

    mode: Mode = "milp"
    solver: SolverName = "cbc"
    budget: float = 0.1
    """Largest share of one step's expected progress that freezing may drop, in [0, 1]."""
    group_cap: float = 0.75
    """Largest share of a step's microbatches in which one group may be frozen, in [0, 1]."""
    stage_cap: float | None = None
    """Optional cap on a stage's mean freeze ratio (TimelyFreeze uses 0.9)."""
    sensitivity: Estimator | Literal["auto"] = "gns"
    """What freezing costs in progress (`freezeopt.model.sensitivity`); `auto`: see `for_profile`."""
    objective: Literal["auto", "step", "ttq"] = "step"
    """`step`: the shortest step under `budget`. `ttq`: the least predicted time to quality, the
    budget chosen up to `budget` (the cap), or nothing frozen where freezing does not pay
    (`freezeopt.solver.ttq`). `auto`: see `for_profile` (the command line's default)."""
    tolerance: float = 0.0
    """Phase 2 may lengthen the step by this share of the phase-1 optimum to drop less signal."""
    time_limit: float = 60.0
    """Seconds for the whole solve: the LP, the heuristic's search, the LP dives and both MILP
    phases (the heuristic always answers: past the limit its search stops with the plan so far)."""
    gap: float = 0.005
    """Relative MILP gap at which the solver may stop."""
    threads: int = 1
    write_model: Path | None = None
    """Write the phase-1 model here (`.lp` or `.mps`) and phase 2 beside it (`NAME.phase2.lp`)."""
    fallback: Literal["none", "heuristic"] = "none"
    """On a solver failure in `milp` or `lp` (missing, crashed, out of time before the LP solved),
    or where the LP would most likely not finish in the time (`LP_FLOOR_SHARE`): `heuristic`
    answers with the search from a plan built without the LP (status `heuristic_fallback`, LP
    bound replaced by the rank-load bound of `freezeopt.solver.balance` or the first-order relaxation's;
    the search stops at the time limit) instead of failing. The `heuristic` mode always does this."""

    def __post_init__(self) -> None:
        """Refuse values out of range: an `InputError` naming the field."""
        for name in ("budget", "group_cap", "tolerance"):
            v = getattr(self, name)
            if not (isinstance(v, float | int) and math.isfinite(v) and 0 <= v <= 1):
                raise InputError(f"{option(name)} must be a number in [0, 1] (got {v})")
        cap = self.stage_cap
        if cap is not None and not (math.isfinite(cap) and 0 <= cap <= 1):
            raise InputError(f"{option('stage_cap')} must be in [0, 1] (got {cap})")
        if not (self.time_limit > 0 and math.isfinite(self.time_limit)):
            raise InputError(
                f"{option('time_limit')} must be a positive, finite number of seconds "
                f"(got {self.time_limit})"
            )
        if not (0 <= self.gap < 1):
            raise InputError(f"{option('gap')} must be in [0, 1) (got {self.gap})")
        if not 1 <= self.threads <= MAX_THREADS:
            raise InputError(
                f"{option('threads')} must be between 1 and {MAX_THREADS} (got {self.threads})"
            )
        if self.fallback not in ("none", "heuristic"):
            raise InputError(f"unknown fallback {self.fallback!r}; use none or heuristic")
        if self.objective not in ("auto", "step", "ttq"):
            raise InputError(f"unknown objective {self.objective!r}; use auto, step or ttq")
        if self.mode not in MODES:
            raise InputError(f"unknown mode {self.mode!r}; use one of {', '.join(MODES)}")
        if self.solver not in SOLVERS:
            raise InputError(f"unknown solver {self.solver!r}; use one of {', '.join(SOLVERS)}")

    @property
    def estimator(self) -> Estimator:
        """`sensitivity`, once `for_profile` has resolved `auto`."""
        if self.sensitivity == "auto":
            raise InputError("sensitivity 'auto' depends on the profile: resolve it (for_profile)")
        return self.sensitivity

    def for_profile(self, measured: bool) -> SolveOptions:
        """These options with `auto` resolved for a profile that did (`measured`) or did not
        measure the loss cost (a probe: `freezeopt profile` with gradient traces): the `measured`
        sensitivity and the `ttq` objective where it did — on the time-to-quality benchmark
        (benchmarks/TTQ.md) never slower than not freezing, and the fastest policy from scratch —
        else `gns` and the shortest step under the budget (`ttq` on a modelled sensitivity froze
        far too much there: benchmarks/TTQ-gns-curve.md)."""
        sens = self.sensitivity
        if sens == "auto":
            sens = "measured" if measured else "gns"
        obj = self.objective
        if obj == "auto":
            obj = "ttq" if sens == "measured" else "step"
        return replace(self, sensitivity=sens, objective=obj)


@dataclass(frozen=True, slots=True, kw_only=True)
class SolveResult:
    """The answer and the figures that put it in context (times in ms)."""

    status: str
    """`optimal`, `time_limit` (best found, not proven), `heuristic` or `heuristic_fallback`."""
    mode: Mode
    solver: SolverName
    baseline_ms: float
    """Simulated step time with nothing frozen."""
    all_frozen_ms: float
    """Simulated step time with every freezable group frozen everywhere: the floor."""
    lp_bound_ms: float
    """Phase-1 optimum of the LP relaxation under the same budget and caps: no plan beats it.
    Where the answer came without the LP (`bound_from_lp` false), a bound of its own, at or below
    the LP's: the rank-load bound or the first-order relaxation's (the notes say which)."""
    predicted_ms: float
    """Simulated step time of the answer."""
    gap: float
    """(predicted − LP bound) / predicted: an upper bound on how far the answer can be from optimal."""
    signal_dropped: float
    """Share of one step's expected progress the answer drops."""
    solve_seconds: float
    frozen: Mapping[Key, float]
    """(action, group index) → frozen extent (1.0 in milp/heuristic; fractions in lp). Zeros omitted."""
    budget: float
    notes: tuple[str, ...] = ()
    bound_from_lp: bool = True
    """Whether `lp_bound_ms` is the LP relaxation's optimum (see `lp_bound_ms`)."""
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds spent building models (`build`: PuLP's, or the LP's arrays), in the solver
    (`solver`) and in the rest (`other`)."""

    @property
    def progress_ratio(self) -> float:
        """Share of a step's progress the plan keeps: 1 − `signal_dropped`."""
        return min(1.0, max(0.0, 1.0 - self.signal_dropped))

    @property
    def time_to_quality(self) -> float | None:
        """Predicted time to the same loss over not freezing's, (predicted / baseline) / progress
        ratio: below 1 is sooner (`freezeopt.solver.ttq`); None where the plan keeps no progress."""
        rho = self.progress_ratio
        if rho <= 0:
            return None
        tau = self.predicted_ms / self.baseline_ms if self.baseline_ms > 0 else 1.0
        return tau / rho


class FreezeProblem:
    """What may be frozen in one DAG under one set of options, and what a plan costs.

    Built once per solve (a re-plan builds its own); the timer and the key index are made on first
    use and kept. Plans are mappings from `Key` to the frozen extent (1.0 for whole microbatches,
    fractions from the LP)."""

    def __init__(self, dag: PipelineDag, signal: Signal, opts: SolveOptions):
        self.dag, self.opts = dag, opts
        m = dag.n_microbatches
        self.kmax = math.floor(opts.group_cap * m + 1e-9)
        """Most microbatches of a step in which one group may be frozen."""
        self.loss = {(s, g): sig.loss for s, row in enumerate(signal) for g, sig in enumerate(row)}
        """(stage, group) → progress lost when frozen in k microbatches, k = 0…M (convex)."""
        self.keys: list[Key] = [
            (a, g)
            for a in dag.freezable()
            for g, c in enumerate(dag.group_cost[a.stage])
            if c > 0 and self.kmax > 0
        ]
        """Every freezable key, grouped by action in DAG order, each action's in group order."""
        self.by_group: dict[tuple[int, int], list[Key]] = {}
        for k in self.keys:
            self.by_group.setdefault((k[0].stage, k[1]), []).append(k)
        self.stage_share = {
            (s, g): c / sum(cs)
            for s, cs in enumerate(dag.group_cost)
            for g, c in enumerate(cs)
            if c > 0
        }
        """(stage, group) → the group's share of its stage's freezable time (the stage cap's weight)."""

    @functools.cached_property
    def timer(self) -> Timer:
        """The DAG as arrays for re-timing (built once per problem: about 0.1 s per 8 k actions)."""
        return Timer(self.dag)

    @functools.cached_property
    def index(self) -> KeyIndex:
        """The keys as arrays over `timer`'s positions, for the heuristic's search."""
        return KeyIndex.of(self)

    @property
    def stage_load_cap(self) -> float:
        """A stage's largest load (frozen microbatches weighted by share; inf without a stage cap)."""
        cap = self.opts.stage_cap
        return math.inf if cap is None else cap * self.dag.n_microbatches + 1e-6

    def makespan(self, plan: Mapping[Key, float]) -> float:
        """The step time `simulate` gives for a plan (durations clipped at zero as
        `PipelineDag.durations` clips them)."""
        t = self.timer
        return t.times(np.maximum(t.durations(plan), 0.0))[0]

    def counts(self, frozen: Mapping[Key, float]) -> dict[tuple[int, int], float]:
        """(stage, group) → microbatches frozen (summed extents)."""
        out: dict[tuple[int, int], float] = {}
        for (a, g), x in frozen.items():
            out[(a.stage, g)] = out.get((a.stage, g), 0.0) + x
        return out

    def signal_of(self, frozen: Mapping[Key, float]) -> float:
        """Signal dropped by a plan (piecewise-linear in the count for fractional plans)."""
        return sum(pwl(self.loss[sg], k) for sg, k in self.counts(frozen).items())

    def fits(self, frozen: Mapping[Key, float]) -> bool:
        """Budget, group caps and stage caps all hold (with a small tolerance)."""
        counts = self.counts(frozen)
        if any(k > self.kmax + 1e-6 for k in counts.values()):
            return False
        if self.opts.stage_cap is not None:
            per_stage: dict[int, float] = {}
            for (s, g), k in counts.items():
                per_stage[s] = per_stage.get(s, 0.0) + k * self.stage_share[(s, g)]
            cap = self.opts.stage_cap * self.dag.n_microbatches + 1e-6
            if any(v > cap for v in per_stage.values()):
                return False
        return sum(pwl(self.loss[sg], k) for sg, k in counts.items()) <= self.opts.budget + 1e-9

    def tally(self, on: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, float]:
        """What the search's moves and the LP dive keep up to date move by move, for the plan that
        freezes the keys of `on`: the frozen count per (stage, group) number (`KeyIndex.pairs`),
        the signal dropped, each stage's load (frozen microbatches weighted by share) against its
        cap, and the cap (inf when there is none)."""
        ix = self.index
        count = np.bincount(ix.sg_id[on], minlength=len(ix.pairs))
        load = np.bincount(
            ix.pair_stage, weights=count * ix.pair_share, minlength=self.dag.n_stages
        )
        signal = sum(self.loss[sg][n] for sg, n in zip(ix.pairs, count.tolist(), strict=True) if n)
        return count, signal, load, self.stage_load_cap


@dataclass(slots=True)
class Spent:
    """Seconds a solve spent building models and inside solvers (`SolveResult.timings`)."""

    build: float = 0.0
    solver: float = 0.0


@dataclass(slots=True)
class Deadline:
    """When the heuristic's search must stop (`time.perf_counter()` seconds), and whether it did.

    The search asks once per try; a try at 64×256 takes tens of milliseconds, so `passed` also
    answers True when the longest try since `start_search` would not end by `at`."""

    at: float = math.inf
    hit: bool = False
    _last: float | None = None
    _try: float = 0.0

    def start_search(self) -> None:
        """Forget the last call: the time since then was not a try of the search."""
        self._last = None

    def left(self) -> float:
        """Seconds until `at` (0 once past)."""
        return max(0.0, self.at - time.perf_counter())

    def expired(self) -> bool:
        """`passed` for a check that is not a try: True once `at` is past."""
        if not self.hit and time.perf_counter() > self.at:
            self.hit = True
        return self.hit

    def passed(self) -> bool:
        """True from the first call at which another try would end past `at` on (so a search
        cut short stays cut)."""
        if not self.hit:
            now = time.perf_counter()
            if self._last is not None:
                self._try = max(self._try, now - self._last)
            self._last = now
            if now + self._try > self.at:
                self.hit = True
        return self.hit


@dataclass(frozen=True, slots=True)
class KeyIndex:
    """The freezable (action, group) keys of a problem as arrays over `Timer` positions, so the
    heuristic's search moves integers and numpy arrays instead of hashing `Action`s: in Python
    dicts its bookkeeping took about 30 times as long as the compiled re-timings themselves."""

    act: np.ndarray
    """Per key: its action's position in `dag.order`."""
    cost: np.ndarray
    """Per key: ms saved when it is frozen."""
    sg: tuple[tuple[int, int], ...]
    """Per key: (stage, group)."""
    sg_id: np.ndarray
    """Per key: its (stage, group) as one number, ordered as the pairs are."""
    rank_a: np.ndarray
    """Per action position: where its name (`0B3`) sorts among all names; the search breaks ties
    by name, as it always has."""
    offset: np.ndarray
    """Per stage and group: the group's place among its stage's keys of one action (−1: not
    freezable), so a key's index is `at_ptr[position of its action] + offset[stage, group]`."""
    idx: Mapping[Action, int]
    """Action → position (the timer's)."""
    base: np.ndarray
    """Per action position: its duration with nothing frozen (the timer's)."""
    at_ptr: np.ndarray
    """Action position v's keys are `at_ptr[v]` up to `at_ptr[v + 1]` (keys come grouped by action,
    in DAG order)."""
    group_a: np.ndarray
    """Per key: its group, as an array."""
    pairs: tuple[tuple[int, int], ...]
    """The (stage, group) of each `sg_id`."""
    pair_stage: np.ndarray
    pair_share: np.ndarray
    """Per `sg_id`: its stage, and its share of the stage's freezable time."""
    marginal: np.ndarray
    """Per `sg_id` and count n (1…kmax): the signal of its n-th frozen microbatch (0 at n = 0)."""

    @staticmethod
    def of(model: FreezeProblem) -> KeyIndex:
        # Arrays rather than per-key Python containers: at 64×256 this took 0.3 s, mostly the
        # garbage collector walking the DAG's objects while tens of thousands of lists were made.
        keys = model.keys
        timing = model.timer
        idx = timing.idx
        n_keys = len(keys)
        pairs = sorted(model.by_group)
        gcost = model.dag.group_cost
        width = max((len(row) for row in gcost), default=0)
        offset = np.full((len(gcost), width), -1, dtype=np.int64)
        number = np.full((len(gcost), width), -1, dtype=np.int64)
        for j, (s, g) in enumerate(pairs):
            number[s, g] = j
        gc = np.zeros((len(gcost), width))  # per stage and group: ms saved when frozen
        for s, row in enumerate(gcost):
            live = [g for g, c in enumerate(row) if c > 0]
            offset[s, live] = np.arange(len(live))
            gc[s, : len(row)] = row
        act = np.fromiter(_positions(keys, idx), dtype=np.int64, count=n_keys)
        group_a = np.fromiter((g for _, g in keys), dtype=np.int64, count=n_keys)
        if n_keys and not np.all(np.diff(act) >= 0):
            raise ValueError("keys must be grouped by action in DAG order")
        n = len(timing.order)
        stage_of = np.fromiter((a.stage for a in timing.order), dtype=np.int64, count=n)
        stage_a = stage_of[act]
        names = np.array([str(a) for a in timing.order])
        rank_a = np.empty(n, dtype=np.int64)
        rank_a[np.argsort(names, kind="stable")] = np.arange(n, dtype=np.int64)
        marginal = np.zeros((len(pairs), model.kmax + 1))
        for j, sg in enumerate(pairs):
            curve = np.asarray(model.loss[sg][: model.kmax + 1], dtype=float)
            marginal[j, 1 : len(curve)] = np.diff(curve)
        at_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(act, minlength=n), out=at_ptr[1:])
        key_sg = tuple(zip(stage_a.tolist(), group_a.tolist(), strict=True))
        return KeyIndex(
            act=act,
            cost=gc[stage_a, group_a],
            sg=key_sg,
            sg_id=number[stage_a, group_a],
            rank_a=rank_a,
            offset=offset,
            idx=idx,
            base=timing.base,
            at_ptr=at_ptr,
            group_a=group_a,
            pairs=tuple(pairs),
            pair_stage=np.array([s for s, _ in pairs], dtype=np.int64),
            pair_share=np.array([model.stage_share[sg] for sg in pairs], dtype=float),
            marginal=marginal,
        )

    def on_path(self, path: Sequence[int]) -> np.ndarray:
        """The keys of the actions of `path`, in path order (each action's in group order)."""
        p = np.asarray(path, dtype=np.int64)
        lo, n = self.at_ptr[p], self.at_ptr[p + 1] - self.at_ptr[p]
        first = np.repeat(lo - np.concatenate(([0], np.cumsum(n)[:-1])), n)
        return first + np.arange(int(n.sum()), dtype=np.int64)

    def mask(self, plan: Mapping[Key, float]) -> np.ndarray:
        """Which keys `plan` freezes (KeyError for a key the model does not have)."""
        on = np.zeros(len(self.sg), dtype=bool)
        if not plan:
            return on
        idx = self.idx
        cols = np.fromiter(
            (x for a, g in plan for x in (idx[a], a.stage, g)), dtype=np.int64, count=3 * len(plan)
        ).reshape(-1, 3)
        v, stage, group = cols[:, 0], cols[:, 1], cols[:, 2]
        ok = (group >= 0) & (group < self.offset.shape[1])
        off = np.where(ok, self.offset[stage, np.where(ok, group, 0)], -1)
        i = self.at_ptr[v] + off
        if not np.all((off >= 0) & (i < self.at_ptr[v + 1])):
            for k in plan:  # name the first key the model does not have
                self.position(k)
        on[i] = True
        return on

    def position(self, key: Key) -> int:
        """A key's index (KeyError for a key the model does not have)."""
        a, g = key
        off = int(self.offset[a.stage, g]) if 0 <= g < self.offset.shape[1] else -1
        v = self.idx[a]
        i = int(self.at_ptr[v]) + off
        if off < 0 or i >= self.at_ptr[v + 1]:
            raise KeyError(key)
        return i

    def durations(self, on: np.ndarray) -> np.ndarray:
        """Each action's duration with the keys of `on` frozen."""
        d = self.base.copy()
        np.subtract.at(d, self.act[on], self.cost[on])
        return d

    def retime(self, d: np.ndarray, on: np.ndarray, keys: Sequence[int]) -> np.ndarray:
        """`d` with the actions of `keys` re-costed from `on` (a copy; `d` is untouched)."""
        out = d.copy()
        for v in {int(self.act[i]) for i in keys}:
            x = float(self.base[v])
            for j in range(int(self.at_ptr[v]), int(self.at_ptr[v + 1])):
                if on[j]:
                    x -= float(self.cost[j])
            out[v] = x
        return out

    def plan(self, model: FreezeProblem, on: np.ndarray) -> dict[Key, float]:
        return {model.keys[i]: 1.0 for i in np.flatnonzero(on).tolist()}


def _positions(keys: Sequence[Key], idx: Mapping[Action, int]) -> Iterator[int]:
    """Each key's action position; a key's action is looked up only when it is not the same
    object as the last key's (keys come grouped by action: a quarter of the lookups at 4 groups)."""
    last: Action | None = None
    v = -1
    for a, _ in keys:
        if a is not last:
            last, v = a, idx[a]
        yield v


def pwl(loss: tuple[float, ...], k: float) -> float:
    """Piecewise-linear interpolation of `loss` at count `k`."""
    k = min(max(k, 0.0), len(loss) - 1)
    j = min(math.floor(k), len(loss) - 2) if len(loss) > 1 else 0
    if len(loss) == 1:
        return loss[0]
    return loss[j] + (loss[j + 1] - loss[j]) * (k - j)
