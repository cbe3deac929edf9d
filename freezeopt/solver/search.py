"""The heuristic's search: whole-microbatch plans made faster move by move, on arrays.

Why its own module: every answer that is not the exact LP ends here. `freezeopt.solver.modes` hands it
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

Everything works on one boolean array over the problem's keys (`KeyIndex`): at 64×256 the search
re-times the DAG thousands of times (`freezeopt.model.simulate.Timer`, compiled), and bookkeeping in
Python dicts of `Action`s took about 30 times as long as the re-timings themselves.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np

from freezeopt.model.dag import PipelineDag
from freezeopt.model.simulate import Timer
from freezeopt.solver.problem import Deadline, FreezeProblem, Key

__all__ = [
    "BATCH",
    "FILL_BATCH",
    "KICK",
    "TRIES",
    "load_search_kernels",
    "search",
]


TRIES = 200
"""Re-timings each fill or swap search may try (the time limit also stops them). Until the
simulator's passes were compiled, DAGs over 20,000 actions got 20: at 1F1B 64×256, 200 take the
gap to the LP bound from 3.74 % to 2.98 %. That search took 44–51 s with plans in dicts and takes
6.2 s on arrays (`KeyIndex`), with the same plan; more tries barely help (32×128: 2.02 % at 200,
1.95 % at 2,000), because the search stops at a local optimum, not at the count."""
SWAP_ROUNDS = 4
"""At most this many rounds of swap-then-fill in one pass of the moves (`_moves`)."""


def search(
    problem: FreezeProblem,
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
    dag = problem.dag
    clock = clock if clock is not None else Deadline()
    clock.start_search()
    timing = problem.timer
    on = problem.index.mask(plan)  # the moves change it in place
    changed = _moves(dag, problem, on, clock, batch)
    if kicks and on.any():
        ix = problem.index
        span = timing.times(ix.durations(on))[0]
        share = KICK
        while share <= KICK_MAX and not clock.passed():
            trial = on.copy()
            _release(problem, trial, share)
            _moves(dag, problem, trial, clock, batch)
            t = timing.times(ix.durations(trial))[0]
            if t < span - 1e-9:
                on, span, changed = trial, t, True
            else:
                share *= 2
    return problem.index.plan(problem, on) if changed else plan


def _moves(
    dag: PipelineDag, problem: FreezeProblem, on: np.ndarray, clock: Deadline, batch: int
) -> bool:
    """Fill, then swap and fill again while swaps help, at most `SWAP_ROUNDS` times (`search`);
    whether anything changed."""
    timing = problem.timer
    changed = _fill(dag, problem, on, TRIES, timing, clock=clock, batch=batch)
    for _ in range(SWAP_ROUNDS):  # a swap shortens the critical path at no signal cost
        if not _swap(dag, problem, on, TRIES, timing, clock=clock) and not _swap(
            dag, problem, on, TRIES, timing, cross=True, clock=clock
        ):
            break
        changed = True
        _fill(dag, problem, on, TRIES, timing, clock=clock, batch=batch)
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


def _release(problem: FreezeProblem, on: np.ndarray, share: float) -> None:
    """Unfreeze the `share` of the keys frozen in `on` (at least one) whose actions have the most
    slack (ties: the first keys)."""
    ix, timing = problem.index, problem.timer
    frozen = np.flatnonzero(on)
    d = ix.durations(on)
    span, _, end, _ = timing.times(d)
    slack = timing.slack(d, end, span)
    k = max(1, int(share * len(frozen)))
    on[frozen[np.argsort(-slack[ix.act[frozen]], kind="stable")[:k]]] = False


def _fill(
    dag: PipelineDag,
    problem: FreezeProblem,
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
    ix = problem.index
    count, signal, load, stage_cap = problem.tally(on)
    budget = problem.opts.budget + 1e-9
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
        keys, j, n = keys[n <= problem.kmax], j[n <= problem.kmax], n[n <= problem.kmax]
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
                problem, keys[order], count, load, signal, stage_cap, batch
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
    problem: FreezeProblem,
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
    ix = problem.index
    budget = problem.opts.budget + 1e-9
    chosen: list[int] = []
    added: dict[int, int] = {}
    extra: dict[int, float] = {}  # stage → load added
    for i in ranked.tolist():
        k = int(ix.sg_id[i])
        n = int(count[k]) + added.get(k, 0) + 1
        st = int(ix.pair_stage[k])
        more = extra.get(st, 0.0) + float(ix.pair_share[k])
        ds = float(ix.marginal[k, n]) if n <= problem.kmax else math.inf
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
    """The swap search's ranking of donors, compiled (numba, through `freezeopt.model.simulate.jit`)."""
    from freezeopt.model.simulate import jit

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
    (`freezeopt.solver.modes.load_kernels` loads every kernel a solve may run)."""
    one, no, zero = np.ones(1), np.zeros(1, dtype=bool), np.zeros(1, dtype=np.int64)
    _donor_pass()(no, zero, one, one, no, zero, zero, 1, 1)


BATCH = 8
"""Same-group swaps the search tries at once before trying them one at a time."""


def _swap(
    dag: PipelineDag,
    problem: FreezeProblem,
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
    ix = problem.index
    d = ix.durations(on)
    span, _, end, path = timing.times(d)
    budget = problem.opts.budget + 1e-9
    count, signal, load, stage_cap = problem.tally(on)
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
            if n + 1 > problem.kmax:
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
