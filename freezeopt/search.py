"""The heuristic's search: whole-microbatch plans made faster move by move, on arrays.

Why its own module: every answer that is not the exact LP ends here. `freezeopt.solve` hands it
a start — the LP rounded down per group, an LP dive's plan, or, without the LP, the rank-balanced
plan or the first-order relaxation's rounded plan — and it returns a plan at least as fast, within
the budget, the group caps and the stage caps, by the time limit (`Deadline`).

The moves (`search`): fill — freeze more on the critical path, the most time saved per signal
spent first (`_fill`; in batches while time is short, `FILL_BATCH`); swap — move a group's
freezing from a microbatch with slack onto the critical path, same counts and so the same signal
(`_swap`; with `cross`, into another group when budget and caps allow; up to `BATCH` at once); and
fill again while swaps help, up to `SWAP_ROUNDS` times. With `kicks`, time the moves leave goes
to kicks: release the frozen keys with the most slack and search again, keeping the plan when the
step gets shorter (`KICK`).

Everything works on one boolean array over the model's keys (`KeyIndex`): at 64×256 the search
re-times the DAG thousands of times (`freezeopt.simulate.Timer`, compiled), and bookkeeping in
Python dicts of `Action`s took about 30 times as long as the re-timings themselves.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from freezeopt.actions import Action
from freezeopt.dag import PipelineDag
from freezeopt.simulate import Timer

if TYPE_CHECKING:
    from freezeopt.solve import _Model as Model  # solve imports this module

__all__ = [
    "BATCH",
    "FILL_BATCH",
    "KICK",
    "TRIES",
    "Deadline",
    "KeyIndex",
    "load_search_kernels",
    "search",
    "stage_load_cap",
    "tally",
]

Key = tuple[Action, int]


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


TRIES = 200
"""Re-timings each fill or swap search may try (the time limit also stops them). Until the
simulator's passes were compiled, DAGs over 20,000 actions got 20: at 1F1B 64×256, 200 take the
gap to the LP bound from 3.74 % to 2.98 %. That search took 44–51 s with plans in dicts and takes
6.2 s on arrays (`KeyIndex`), with the same plan; more tries barely help (32×128: 2.02 % at 200,
1.95 % at 2,000), because the search stops at a local optimum, not at the count."""
SWAP_ROUNDS = 4
"""At most this many rounds of swap-then-fill in one pass of the moves (`_moves`)."""


@dataclass(frozen=True, slots=True)
class KeyIndex:
    """The freezable (action, group) keys of a model as arrays over `Timer` positions, so the
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
    def of(model: Model) -> KeyIndex:
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

    def plan(self, model: Model, on: np.ndarray) -> dict[Key, float]:
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


def search(
    dag: PipelineDag,
    model: Model,
    plan: dict[Key, float],
    clock: Deadline | None = None,
    *,
    batch: int = 1,
    kicks: bool = False,
) -> dict[Key, float]:
    """Freeze more on the critical path while the budget allows (`_fill`, `batch` keys at a time
    to start with), then move frozen microbatches onto the critical path (`_swap`) and fill
    again, while swaps help. The moves work on one array of the keys frozen: the plan is turned
    into it and back once (at 64×256 each turn took 10–40 ms).

    With `kicks`, time left once the moves stop helping goes to kicks (`_release`): the `KICK`
    share of the frozen keys with the most slack is released and the moves run again; the result
    is kept when the step is shorter, else the next kick releases twice as many, up to
    `KICK_MAX`. For callers whose answer is the search's (not when LP dives and the MILP follow)."""
    clock = clock if clock is not None else Deadline()
    clock.start_search()
    timing = model.timer
    on = model.index.mask(plan)  # the moves change it in place
    changed = _moves(dag, model, on, clock, batch)
    if kicks and on.any():
        ix = model.index
        span = timing.times(ix.durations(on))[0]
        share = KICK
        while share <= KICK_MAX and not clock.passed():
            trial = on.copy()
            _release(model, trial, share)
            _moves(dag, model, trial, clock, batch)
            t = timing.times(ix.durations(trial))[0]
            if t < span - 1e-9:
                on, span, changed = trial, t, True
            else:
                share *= 2
    return model.index.plan(model, on) if changed else plan


def _moves(dag: PipelineDag, model: Model, on: np.ndarray, clock: Deadline, batch: int) -> bool:
    """Fill, then swap and fill again while swaps help, at most `SWAP_ROUNDS` times (`search`);
    whether anything changed."""
    timing = model.timer
    changed = _fill(dag, model, on, TRIES, timing, clock=clock, batch=batch)
    for _ in range(SWAP_ROUNDS):  # a swap shortens the critical path at no signal cost
        if not _swap(dag, model, on, TRIES, timing, clock=clock) and not _swap(
            dag, model, on, TRIES, timing, cross=True, clock=clock
        ):
            break
        changed = True
        _fill(dag, model, on, TRIES, timing, clock=clock, batch=batch)
    return changed


KICK = 0.005
KICK_MAX = 0.04
"""A kick releases this share of the frozen keys (`KICK`, doubled after each kick that does not
help, up to `KICK_MAX`). Frozen keys whose actions have slack spend budget without shortening the
step; a swap moves one only to a key of its own group (or of a group that frees at least as much
signal), while a release hands their budget back to the fill, which spends it on the critical
path. Measured at 1F1B 64×256 with 10 s (the moves stop helping after about 7.5 s): 3.05 % from
the LP bound without kicks, 2.53–2.54 % with two kicks of 0.5 % or 2 % of the keys by slack, and
2.81–2.92 % releasing keys at random instead."""


def _release(model: Model, on: np.ndarray, share: float) -> None:
    """Unfreeze the `share` of the keys frozen in `on` (at least one) whose actions have the most
    slack (ties: the first keys)."""
    ix, timing = model.index, model.timer
    frozen = np.flatnonzero(on)
    d = ix.durations(on)
    span, _, end, _ = timing.times(d)
    slack = timing.slack(d, end, span)
    k = max(1, int(share * len(frozen)))
    on[frozen[np.argsort(-slack[ix.act[frozen]], kind="stable")[:k]]] = False


def tally(
    dag: PipelineDag, model: Model, on: np.ndarray
) -> tuple[np.ndarray, float, np.ndarray, float]:
    """What `_fill`, `_swap` and the LP dive (`freezeopt.dive`) keep up to date move by move, for
    the plan that freezes the keys of `on`: the frozen count per (stage, group) number
    (`KeyIndex.pairs`), the signal dropped, each stage's load (frozen microbatches weighted by
    share) against its cap, and the cap (inf when there is none)."""
    ix = model.index
    count = np.bincount(ix.sg_id[on], minlength=len(ix.pairs))
    load = np.bincount(ix.pair_stage, weights=count * ix.pair_share, minlength=dag.n_stages)
    signal = sum(model.loss[sg][n] for sg, n in zip(ix.pairs, count.tolist(), strict=True) if n)
    return count, signal, load, stage_load_cap(dag, model)


def stage_load_cap(dag: PipelineDag, model: Model) -> float:
    """A stage's largest load (frozen microbatches weighted by share; inf without a stage cap)."""
    cap = model.opts.stage_cap
    return math.inf if cap is None else cap * dag.n_microbatches + 1e-6


def _fill(
    dag: PipelineDag,
    model: Model,
    on: np.ndarray,
    tries: int,
    timing: Timer,
    *,
    clock: Deadline | None = None,
    batch: int = 1,
) -> bool:
    """Freeze more (action, group)s on the critical path, the most time saved per signal spent
    first, while the step gets shorter and budget and caps allow: one at a time (the best four
    tried), or, with `batch` > 1 while the time left on `clock` (at the pace of the tries so far)
    would not fit a try for each key the budget left allows, `batch` at once (kept when the step
    gets shorter; the next batch twice as large, up to `FILL_BATCH_MAX`, else half as large).
    Changes `on` (the keys frozen) in place; returns whether it froze more."""
    if clock is not None and clock.expired():
        return False
    ix = model.index
    count, signal, load, stage_cap = tally(dag, model, on)
    budget = model.opts.budget + 1e-9
    d = ix.durations(on)
    span, _, _, path = timing.times(d)
    grew = False
    began, done = time.perf_counter(), 0
    for _ in range(tries):
        if clock is not None and clock.passed():
            break
        # candidates: keys on the critical path not frozen yet, within group cap, stage cap and
        # budget; most ms saved per signal spent first, ties by action name, group, path order
        keys = ix.on_path(path)
        keys = keys[~on[keys]]
        j = ix.sg_id[keys]
        n = count[j] + 1
        keys, j, n = keys[n <= model.kmax], j[n <= model.kmax], n[n <= model.kmax]
        fits = load[ix.pair_stage[j]] + ix.pair_share[j] <= stage_cap
        keys, j, n = keys[fits], j[fits], n[fits]
        d_sig = ix.marginal[j, n]
        fits = signal + d_sig <= budget
        keys, d_sig = keys[fits], d_sig[fits]
        ratio = -ix.cost[keys] / np.maximum(d_sig, 1e-12)
        order = np.lexsort((ix.group_a[keys], ix.rank_a[ix.act[keys]], ratio))
        short = False  # batches only while the time left cannot fit a try per key the budget allows
        if batch > 1 and done and clock is not None and len(keys):
            fit = (clock.at - time.perf_counter()) * done / max(time.perf_counter() - began, 1e-9)
            short = fit < (budget - signal) / max(float(np.mean(d_sig[order[:64]])), 1e-12)
        done += 1
        if short:
            chosen, added, b_signal = _batch(
                model, keys[order], count, load, signal, stage_cap, batch
            )
            if len(chosen) > 1:
                on[chosen] = True
                t_d = ix.retime(d, on, chosen)
                t_span, _, _, t_path = timing.times(t_d)
                if t_span < span - 1e-9:
                    d, span, path, grew = t_d, t_span, t_path, True
                    for k, a in added.items():
                        count[k] += a
                        load[ix.pair_stage[k]] += a * ix.pair_share[k]
                    signal = b_signal
                    batch = min(2 * batch, FILL_BATCH_MAX)
                    continue
                on[chosen] = False
            batch //= 2
        improved = False
        for i, ds in zip(keys[order[:4]].tolist(), d_sig[order[:4]].tolist(), strict=True):
            on[i] = True
            t_d = ix.retime(d, on, (i,))
            t_span, _, _, t_path = timing.times(t_d)
            if t_span < span - 1e-9:
                k = int(ix.sg_id[i])
                d, span, path, improved, grew = t_d, t_span, t_path, True, True
                count[k] += 1
                load[ix.pair_stage[k]] += ix.pair_share[k]
                signal += ds
                break
            on[i] = False
        if not improved:
            break
    return grew


def _batch(
    model: Model,
    ranked: np.ndarray,
    count: np.ndarray,
    load: np.ndarray,
    signal: float,
    stage_cap: float,
    size: int,
) -> tuple[list[int], dict[int, int], float]:
    """Up to `size` of the keys `ranked` (best first) that fit the group caps, stage caps and
    budget together, each group's later units at its curve's later slopes: the keys, how many
    each (stage, group) number gains, and the signal dropped with them."""
    ix = model.index
    budget = model.opts.budget + 1e-9
    chosen: list[int] = []
    added: dict[int, int] = {}
    extra: dict[int, float] = {}  # stage → load added
    for i in ranked.tolist():
        k = int(ix.sg_id[i])
        n = int(count[k]) + added.get(k, 0) + 1
        st = int(ix.pair_stage[k])
        more = extra.get(st, 0.0) + float(ix.pair_share[k])
        ds = float(ix.marginal[k, n]) if n <= model.kmax else math.inf
        if load[st] + more > stage_cap or signal + ds > budget:
            continue
        chosen.append(i)
        added[k] = added.get(k, 0) + 1
        extra[st] = more
        signal += ds
        if len(chosen) == size:
            break
    return chosen, added, signal


FILL_BATCH = 16
FILL_BATCH_MAX = 512
"""The fill from a start built without the LP may freeze `FILL_BATCH` keys at once to begin with.
Such a start (the relaxation's plan rounded down, or the rank-balanced plan) leaves 5–10 % of the
budget, hundreds of keys, and with a 2 s limit at 64×256 one key per re-timing did not get
through them (about 0.6 s of search; the answers left 7–9 % of the budget unused). Batches are
taken only while the time is short for that, so with time enough the fill is as it was. Measured
at 64×256, fresh processes, the previous code and this one alternating (gap to the LP bound,
medians): with 2 s, 1F1B 7.22 → 6.14 % and Interleaved1F1B 3.98 → 3.64 % (five runs each, the
whole budget now used); with 10 s, 3.53 / 3.62 % and 1.33 / 1.28 % (three runs each: within their
spread). Batches without that condition also cost precision where the time sufficed (10 s:
Interleaved1F1B 1.22 → 1.36 %), and after rounding the LP (at most a key per group left) single
keys are the more exact (1F1B 32×128 2.02 % single, 2.05 % batched), so that search keeps them."""


@functools.cache
def _donor_pass() -> Any:
    """The swap search's ranking of donors, compiled (numba, through `freezeopt.simulate.jit`)."""
    from freezeopt.simulate import jit

    @jit
    def top_donors(on, act, slack, cost, on_path, sg_id, rank_a, n_groups, k):
        # Per (stage, group) number, its first k donors: frozen keys off the critical path whose
        # action's slack takes the group's cost back, most slack first, ties by action name (no
        # two keys of a group share an action). A sorted insertion per donor; sorting every
        # frozen key (numpy's lexsort) took about a third of a try at 64×256.
        top = np.full((n_groups, k), -1, np.int64)
        top_s = np.zeros((n_groups, k))
        top_r = np.zeros((n_groups, k), np.int64)
        count = np.zeros(n_groups, np.int64)
        for i in range(on.shape[0]):
            if not on[i]:
                continue
            v = act[i]
            s = slack[v]
            if on_path[v] or not s >= cost[i] - 1e-9:
                continue
            g = sg_id[i]
            r = rank_a[v]
            c = count[g]
            p = c
            while p > 0 and (s > top_s[g, p - 1] or (s == top_s[g, p - 1] and r < top_r[g, p - 1])):
                p -= 1
            if p >= k:
                continue
            for q in range(min(c, k - 1), p, -1):
                top[g, q] = top[g, q - 1]
                top_s[g, q] = top_s[g, q - 1]
                top_r[g, q] = top_r[g, q - 1]
            top[g, p] = i
            top_s[g, p] = s
            top_r[g, p] = r
            if c < k:
                count[g] = c + 1
        return top, count

    return top_donors


def load_search_kernels() -> None:
    """Load (the first time on a machine: compile) the search's compiled pass, the donor ranking
    (`freezeopt.solve.load_kernels` loads every kernel a solve may run)."""
    one, no, zero = np.ones(1), np.zeros(1, dtype=bool), np.zeros(1, dtype=np.int64)
    _donor_pass()(no, zero, one, one, no, zero, zero, 1, 1)


BATCH = 8
"""Same-group swaps the search tries at once before trying them one at a time."""


def _swap(
    dag: PipelineDag,
    model: Model,
    on: np.ndarray,
    tries: int,
    timing: Timer,
    *,
    cross: bool = False,
    clock: Deadline | None = None,
) -> bool:
    """Local search: unfreeze a group in a microbatch whose action has slack to absorb it, and
    freeze a group in an action on the critical path instead: the same group (counts, and so
    signal and caps, unchanged), or with `cross` another one — the frozen group whose release frees
    the most signal, if budget and caps then hold. A move is kept when the step gets shorter.
    Each try first makes up to `BATCH` same-group moves at once (each target its own donor), then,
    if that does not shorten the step, the best four moves one at a time. Changes `on` (the keys
    frozen) in place; returns whether a move helped."""
    if clock is not None and clock.expired():
        return False
    ix = model.index
    d = ix.durations(on)
    span, _, end, path = timing.times(d)
    budget = model.opts.budget + 1e-9
    count, signal, load, stage_cap = tally(dag, model, on)
    stage_of, share_of = ix.pair_stage.tolist(), ix.pair_share.tolist()  # per (stage, group)
    moved = False
    for _ in range(tries):
        if clock is not None and clock.passed():
            break
        slack = timing.slack(d, end, span)
        on_path = np.zeros(len(d), dtype=bool)
        on_path[path] = True
        # donors: frozen where the action could take the group's cost back; per (stage, group)
        # the first `BATCH` by slack (ties: by name), enough for a try's moves
        top, n_top = _donor_pass()(
            on, ix.act, slack, ix.cost, on_path, ix.sg_id, ix.rank_a, len(ix.pairs), BATCH
        )
        donor_of = top[:, 0]
        spare = top.tolist()
        n_spare = n_top.tolist()
        # moves onto the critical path's keys not frozen yet: from the same group's donor, or
        # (with `cross`) from the donor whose release frees the most signal, if budget and caps
        # allow; at most one move per key, tried most ms saved first, ties by action name, group
        keys = ix.on_path(path)
        keys = keys[~on[keys]]
        donor = donor_of[ix.sg_id[keys]]
        move_in, move_out = keys[donor >= 0].tolist(), donor[donor >= 0].tolist()
        lone = keys[donor < 0].tolist() if cross else []
        # the groups with a donor, by the signal their release frees (ties: by group): number,
        # signal freed, stage, share (Python lists: this loop ran slower on numpy scalars)
        by_freed: list[tuple[int, float, int, float]] = []
        if lone:
            has = np.flatnonzero(n_top)
            freed = ix.marginal[has, count[has]]
            by = np.lexsort((has, -freed))
            ranked_has = has[by].tolist()
            by_freed = list(
                zip(
                    ranked_has,
                    freed[by].tolist(),
                    [stage_of[j] for j in ranked_has],
                    [share_of[j] for j in ranked_has],
                    strict=True,
                )
            )
            n_of, load_of = count.tolist(), load.tolist()
        for i in lone:
            k = int(ix.sg_id[i])
            n = n_of[k]
            if n + 1 > model.kmax:
                continue
            cost_in = float(ix.marginal[k, n + 1])
            st = stage_of[k]
            for j, freed, st_j, share_j in by_freed:
                if signal + cost_in - freed > budget:
                    break  # later donors free less
                more = load_of[st] + share_of[k]
                if st_j == st:
                    more -= share_j
                if more <= stage_cap:
                    move_in.append(i)
                    move_out.append(spare[j][0])
                    break
        cand = np.array(move_in, dtype=np.int64)
        order = np.lexsort((ix.group_a[cand], ix.rank_a[ix.act[cand]], -ix.cost[cand]))
        ranked = list(zip(cand[order].tolist(), np.array(move_out)[order].tolist(), strict=True))
        improved = False
        # first, several same-group moves at once (distinct donors, each donor's slack checked by
        # the one re-timing): kept when the step gets shorter, else the moves one at a time
        batch: list[tuple[int, int]] = []
        used: set[int] = set()
        for i, donor in ranked:
            sg = ix.sg[i]
            if ix.sg[donor] != sg:
                continue
            j = int(ix.sg_id[i])
            free = next((o for o in spare[j][: n_spare[j]] if o not in used), None)
            if free is not None:
                used.add(free)
                batch.append((i, free))
            if len(batch) == BATCH:
                break
        if len(batch) > 1:
            ins, outs = [i for i, _ in batch], [j for _, j in batch]
            on[ins], on[outs] = True, False
            t_d = ix.retime(d, on, ins + outs)
            t_span, _, t_end, t_path = timing.times(t_d)
            if t_span < span - 1e-9:
                d, span, end, path, improved, moved = t_d, t_span, t_end, t_path, True, True
                continue
            on[ins], on[outs] = False, True
        for i, donor in ranked[:4]:
            on[i], on[donor] = True, False
            t_d = ix.retime(d, on, (i, donor))
            t_span, _, t_end, t_path = timing.times(t_d)
            if t_span < span - 1e-9:
                k_in, k_out = int(ix.sg_id[i]), int(ix.sg_id[donor])
                if k_in != k_out:
                    signal += float(ix.marginal[k_in, count[k_in] + 1]) - float(
                        ix.marginal[k_out, count[k_out]]
                    )
                    count[k_in] += 1
                    count[k_out] -= 1
                    load[ix.pair_stage[k_in]] += ix.pair_share[k_in]
                    load[ix.pair_stage[k_out]] -= ix.pair_share[k_out]
                d, span, end, path, improved, moved = t_d, t_span, t_end, t_path, True, True
                break
            on[i], on[donor] = False, True
        if not improved:
            break
    return moved
