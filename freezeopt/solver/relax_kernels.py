"""The relaxation's compiled kernels: its soft passes, its knapsack and the reduction of its edges.

What: the numba functions `freezeopt.solver.relax` runs each iteration, and the constants compiled into
them. Why a module of their own: numba caches a compiled function on disk only when the
functions it calls are module-level; defined inside a function (as they were, so that importing
`freezeopt.solver.relax` does not import numba), every process compiled them again — 2.2 s at session
14's end, 6.8 s with session 15's kernels, against 0.3 s to load them from the cache. Importing
this module imports numba (its decorator is `freezeopt.model.simulate.jit`'s); `freezeopt.solver.relax` imports
it on first use.
"""

from __future__ import annotations

import math

import numpy as np

from freezeopt.model.simulate import jit as _jit

NEGLIGIBLE = -40.0
"""Soft-max terms `exp(z)` with `z` at or below this are skipped (`exp(−40) ≈ 4e-18`). Forward,
they are added to a sum of at least 1 and change nothing; backward, a predecessor that far below
an action's latest in-edge gets no share of its weight instead of under 4e-18 of it. The forward
pass keeps each in-edge's share, so the backward pass needs no `exp`: at Interleaved1F1B 64×256
both passes took 1.5 ms (least of 300) with the backward pass recomputing them, 1.1 ms so."""


SOFTPLUS_KNOTS = 32
SOFTPLUS_TO = -NEGLIGIBLE
"""The soft maximum of two terms uses `softplus(z) = log(1 + exp(−z))` for `0 ≤ z < SOFTPLUS_TO`
(0 past it, as `NEGLIGIBLE` drops terms) by cubic interpolation between knots `1/SOFTPLUS_KNOTS`
apart, through the values and slopes there: within 3.2e-10 of it (times `τ`), its slope within
3.1e-8. The shares the backward pass uses are the slope of that cubic, so `p` is the exact
gradient of the smoothed step time computed, and the bound holds as before (any distribution over
paths gives one). Why: `exp` and `log1p` per action were most of a pass; at 64×256 the forward
pass took 0.83–0.98 ms with them and 0.45–0.61 ms with the table (medians of 300)."""


def _softplus_table() -> tuple[np.ndarray, np.ndarray]:
    """`softplus` and its slope at the knots, with one knot past `SOFTPLUS_TO` set to 0."""
    z = np.arange(SOFTPLUS_TO * SOFTPLUS_KNOTS + 2) / SOFTPLUS_KNOTS
    f, df = np.log1p(np.exp(-z)), -np.exp(-z) / (1.0 + np.exp(-z))
    f[z >= SOFTPLUS_TO] = 0.0
    df[z >= SOFTPLUS_TO] = 0.0
    return f, df


SOFTPLUS = _softplus_table()


@_jit
def softplus(z, f_at, df_at):
    # For z ≥ 0: `log(1 + exp(−z))` and the smaller term's share `exp(−z)/(1 + exp(−z))`,
    # as the cubic through the table's values and slopes at the two knots around z (and
    # that cubic's own slope, so the shares are the derivative of what is computed)
    if z >= SOFTPLUS_TO:
        return 0.0, 0.0
    u = z * SOFTPLUS_KNOTS
    i = int(u)
    t = u - i
    h = 1.0 / SOFTPLUS_KNOTS
    f0, f1, d0, d1 = f_at[i], f_at[i + 1], df_at[i] * h, df_at[i + 1] * h
    t2 = t * t
    t3 = t2 * t
    f = (2 * t3 - 3 * t2 + 1) * f0 + (t3 - 2 * t2 + t) * d0 + (3 * t2 - 2 * t3) * f1
    f += (t3 - t2) * d1
    df = (6 * t2 - 6 * t) * (f0 - f1) + (3 * t2 - 4 * t + 1) * d0 + (3 * t2 - 2 * t) * d1
    return f, -df * SOFTPLUS_KNOTS


@_jit
def soft_forward(d, ptr, src, lag, sinks, tau, w, f_at, df_at):
    # `w` (one per edge, or empty: not kept) gets each in-edge's share of its action's soft
    # start, `exp((end_u + lag − start_v)/τ)`: the backward pass's weights, so that it needs
    # no `exp`. Two in-edges (almost every action once implied edges are left out) take the
    # soft maximum `max + τ·softplus(|difference|/τ)` from the table; more take `exp` and
    # `log`, the largest term `exp(0) = 1` not computed.
    n = d.shape[0]
    keep = w.shape[0] > 0
    inv = 1.0 / tau
    start = np.zeros(n)
    end = np.zeros(n)
    for v in range(n):
        lo, hi = ptr[v], ptr[v + 1]
        if hi - lo == 2:
            a = end[src[lo]] + lag[lo]
            b = end[src[lo + 1]] + lag[lo + 1]
            f, q = softplus(abs(a - b) * inv, f_at, df_at)
            start[v] = max(a, b) + tau * f
            if keep:  # the later in-edge's share 1 − q, the other's q
                w[lo], w[lo + 1] = (1.0 - q, q) if a >= b else (q, 1.0 - q)
        elif hi - lo == 1:
            start[v] = end[src[lo]] + lag[lo]
            if keep:
                w[lo] = 1.0
        elif lo < hi:
            m = -1e300
            top = lo
            for j in range(lo, hi):
                r = end[src[j]] + lag[j]
                if r > m:
                    m = r
                    top = j
            s = 1.0
            for j in range(lo, hi):
                e = 0.0
                if j != top:
                    z = (end[src[j]] + lag[j] - m) * inv
                    if z > NEGLIGIBLE:  # below it exp(z) is under half an ulp of s ≥ 1
                        e = math.exp(z)
                        s += e
                if keep:
                    w[j] = e
            start[v] = m + tau * math.log(s)
            if keep:
                w[top] = 1.0
                if s != 1.0:
                    for j in range(lo, hi):
                        w[j] /= s
        end[v] = start[v] + d[v]
    m = -1e300
    for v in sinks:
        if end[v] > m:
            m = end[v]
    s = 0.0
    for v in sinks:
        s += math.exp((end[v] - m) / tau)
    return m + tau * math.log(s), start, end


@_jit
def soft_backward(end, span, ptr, src, lag, sinks, tau, w):
    # each action's weight goes to its in-edges in the shares the forward pass kept in `w`
    n = end.shape[0]
    p = np.zeros(n)
    for v in sinks:
        p[v] = math.exp((end[v] - span) / tau)
    elag = 0.0
    for v in range(n - 1, -1, -1):
        pv = p[v]
        if pv == 0.0:
            continue
        for j in range(ptr[v], ptr[v + 1]):
            if w[j] > 0.0:
                f = pv * w[j]
                p[src[j]] += f
                elag += f * lag[j]
    return p, elag


@_jit
def _before(b, i, j):  # key column i ranks before j: larger benefit, then the earlier column
    return b[i] > b[j] or (b[i] == b[j] and i < j)


@_jit
def _sift(heap, lo, n, k, b):  # restore heap order below position k of heap[lo:lo + n]
    while True:
        c = 2 * k + 1
        if c >= n:
            return
        if c + 1 < n and _before(b, heap[lo + c + 1], heap[lo + c]):
            c += 1
        if not _before(b, heap[lo + c], heap[lo + k]):
            return
        heap[lo + k], heap[lo + c] = heap[lo + c], heap[lo + k]
        k = c


@_jit
def _pop_sorted(heapc, done, n_heap, n_done, o, width, flat):  # list o's best left, sorted on
    lo = o * width
    done[lo + n_done[o]] = heapc[lo]
    n_done[o] += 1
    n_heap[o] -= 1
    heapc[lo] = heapc[lo + n_heap[o]]
    _sift(heapc, lo, n_heap[o], 0, flat[lo : lo + width])


@_jit
def _up(heap, k, r, u):  # the groups' heap: larger ratio first, then the smaller unit
    while k > 0:
        q = (k - 1) // 2
        if r[heap[q]] > r[heap[k]] or (r[heap[q]] == r[heap[k]] and u[heap[q]] < u[heap[k]]):
            return
        heap[k], heap[q] = heap[q], heap[k]
        k = q


@_jit
def _down(heap, n, r, u):
    k = 0
    while True:
        c = 2 * k + 1
        if c >= n:
            return
        if c + 1 < n and (
            r[heap[c + 1]] > r[heap[c]]
            or (r[heap[c + 1]] == r[heap[c]] and u[heap[c + 1]] < u[heap[c]])
        ):
            c += 1
        if r[heap[k]] > r[heap[c]] or (r[heap[k]] == r[heap[c]] and u[heap[k]] < u[heap[c]]):
            return
        heap[k], heap[c] = heap[c], heap[k]
        k = c


@_jit
def knapsack(
    p,
    omat,
    osize,
    group_order,
    group_c,
    mat,
    nkeys,
    slope,
    group_stage,
    group_share,
    room,
    stage_room,
):
    # The greedy of the module docstring without sorting every key. A group's benefit per
    # key is its action's weight `p` times the group's cost, so the groups that share a list
    # of actions (a stage's groups) share the order of their keys: per list a heap of its
    # columns (largest weight first, then the earlier column), popped into a sorted prefix as
    # far as the list's groups need it. Across groups a heap by the ratio of each group's next
    # unit (its next key's benefit over the next segment's slope). Slopes never fall along a
    # group's curve (convex) and its keys come best first, so units leave in the order a
    # stable sort by ratio gives them. Returns each key's amount taken and `Σ benefit·amount`.
    no, width = omat.shape
    ng = mat.shape[0]
    kmax = slope.shape[1]
    x = np.zeros(nkeys)
    load = np.zeros(stage_room.shape[0])
    flat = np.full(no * width, -1.0)  # per list and column: the action's weight
    heapc = np.empty(no * width, dtype=np.int64)  # per list: its unsorted columns, as a heap
    done = np.empty(no * width, dtype=np.int64)  # per list: its columns popped so far, in order
    n_heap = osize.copy()
    n_done = np.zeros(no, dtype=np.int64)
    for o in range(no):
        lo = o * width
        for i in range(osize[o]):
            flat[lo + i] = p[omat[o, i]]
            heapc[lo + i] = i
        for k in range(osize[o] // 2 - 1, -1, -1):
            _sift(heapc, lo, osize[o], k, flat[lo : lo + width])

    nxt = np.zeros(ng, dtype=np.int64)  # units taken: also the rank of the group's next key
    ratio = np.empty(ng)
    unit = np.empty(ng, dtype=np.int64)
    col = np.full(ng, -1, dtype=np.int64)  # the column of each group's next key
    heap = np.empty(ng, dtype=np.int64)
    n_groups = 0
    for g in range(ng):
        if kmax == 0:
            break
        o = group_order[g]
        lo = o * width
        if n_done[o] == 0 and n_heap[o] > 0:  # the list's best column, popped once
            _pop_sorted(heapc, done, n_heap, n_done, o, width, flat)
        if n_done[o] == 0:
            continue
        c = done[lo]
        col[g] = c
        top = flat[lo + c] * group_c[g]
        sl = slope[g, 0]
        ratio[g] = -1.0 if top <= 0.0 else (top / sl if sl > 0.0 else np.inf)
        unit[g] = g * kmax
        heap[n_groups] = g
        _up(heap, n_groups, ratio, unit)
        n_groups += 1
    value = 0.0
    while n_groups > 0:
        g = heap[0]
        if ratio[g] <= 0.0 or room <= 0.0:
            break
        s = group_stage[g]
        more = False
        if load[s] + group_share[g] <= stage_room[s]:  # else no later unit of g fits either
            o = group_order[g]
            lo = o * width
            j = nxt[g]
            amount = 1.0
            if slope[g, j] > 0.0:
                amount = min(1.0, room / slope[g, j])
                room -= amount * slope[g, j]
            c = col[g]
            x[mat[g, c]] = amount
            value += flat[lo + c] * group_c[g] * amount
            load[s] += amount * group_share[g]
            j += 1
            nxt[g] = j
            if j < kmax:
                if n_done[o] == j and n_heap[o] > 0:  # extend the list's sorted prefix
                    _pop_sorted(heapc, done, n_heap, n_done, o, width, flat)
                if j < n_done[o]:
                    c = done[lo + j]
                    col[g] = c
                    top = flat[lo + c] * group_c[g]
                    sl = slope[g, j]
                    ratio[g] = -1.0 if top <= 0.0 else (top / sl if sl > 0.0 else np.inf)
                    unit[g] = g * kmax + j
                    more = True
        if not more:
            n_groups -= 1
            heap[0] = heap[n_groups]
        _down(heap, n_groups, ratio, unit)
    return x, value


@_jit
def _at_least(ratio, g, n, lam):  # how many of group g's first n units have a ratio ≥ lam
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        if ratio[g, mid] >= lam:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit
def _cost(ratio, npos, cum, lam):  # signal of every unit with a ratio ≥ lam
    s = 0.0
    for g in range(npos.shape[0]):
        s += cum[g, _at_least(ratio, g, npos[g], lam)]
    return s


@_jit
def _as_float(bits):
    return np.array([bits]).view(np.float64)[0]


@_jit
def threshold(p, order, omat, group_order, group_c, mat, nkeys, slope, cum, room):
    # The same greedy without stage caps, by a threshold instead of a heap of groups: with
    # each list's columns sorted (`order`, by weight, largest first, ties by column), a
    # group's unit ratios fall along the group, so the units at or above a ratio are a prefix
    # of each group and their signal `cum` a lookup. The last unit the greedy takes has the
    # largest ratio `r` whose units' signal reaches the room (bisection over the bit patterns
    # of positive doubles, which sort as the doubles do); every unit above `r` is taken, then
    # those at `r` in unit order until the room is spent. The same plan as the heap's but for
    # the rounding of the last unit's amount (the room left is summed in another order).
    no, width = omat.shape
    ng, kmax = slope.shape
    val = np.empty((no, width))
    for o in range(no):
        for i in range(width):
            c = order[o, i]
            val[o, i] = p[omat[o, c]] if omat[o, c] >= 0 else -1.0
        i = 0
        while i < width:  # ties to column order (the sort need not be stable)
            j = i + 1
            while j < width and val[o, j] == val[o, i]:
                j += 1
            if j - i > 1:
                order[o, i:j] = np.sort(order[o, i:j])
            i = j
    ratio = np.empty((ng, kmax))
    npos = np.zeros(ng, dtype=np.int64)  # per group: its units with a positive ratio
    for g in range(ng):
        o, c = group_order[g], group_c[g]
        for j in range(kmax):
            b = val[o, j] * c
            sl = slope[g, j]
            r = -1.0 if b <= 0.0 else (b / sl if sl > 0.0 else np.inf)
            ratio[g, j] = r
            if r <= 0.0:
                break
            npos[g] = j + 1
    x = np.zeros(nkeys)
    saved = np.zeros(p.shape[0])  # per action: the time the plan saves
    if room <= 0.0:
        return x, 0.0, saved
    full = npos.copy()  # per group: the units taken whole
    last = -1.0  # the ratio of the units that share what is left, if any
    lo = np.int64(1)  # the least positive double: every positive unit is at or above it
    if _cost(ratio, npos, cum, _as_float(lo)) >= room:
        hi = np.array([np.inf]).view(np.int64)[0]  # cost(lo) ≥ room > cost(hi)
        while hi - lo > 1:
            mid = lo + (hi - lo) // 2
            if _cost(ratio, npos, cum, _as_float(mid)) >= room:
                lo = mid
            else:
                hi = mid
        last = _as_float(lo)
        above = _as_float(hi)
        for g in range(ng):
            full[g] = _at_least(ratio, g, npos[g], above)
    value = 0.0
    for g in range(ng):
        o = group_order[g]
        for j in range(full[g]):
            x[mat[g, order[o, j]]] = 1.0
            saved[omat[o, order[o, j]]] += group_c[g]
            value += val[o, j] * group_c[g]
        room -= cum[g, full[g]]
    if last > 0.0:
        for g in range(ng):
            o = group_order[g]
            j = full[g]
            while j < npos[g] and ratio[g, j] == last and room > 0.0:
                sl = slope[g, j]
                amount = 1.0
                if sl > 0.0:
                    amount = min(1.0, room / sl)
                    room -= amount * sl
                x[mat[g, order[o, j]]] = amount
                saved[omat[o, order[o, j]]] += group_c[g] * amount
                value += val[o, j] * group_c[g] * amount
                j += 1
    return x, value, saved


@_jit
def implied(ptr, src, lag, rank, pos, pre, pre_at):
    # Per edge u → v: whether another in-edge w → v, w after u on u's rank, implies it
    # (`lag(u,v) ≤ lag(w,v) + Σ d_min(u < z ≤ w)`, `pre` the ranks' prefix sums of `d_min`).
    keep = np.ones(src.shape[0], dtype=np.bool_)
    for v in range(ptr.shape[0] - 1):
        for j in range(ptr[v], ptr[v + 1]):
            u = src[j]
            for k in range(ptr[v], ptr[v + 1]):
                w = src[k]
                if k != j and rank[w] == rank[u] and pos[w] > pos[u]:
                    at = pre_at[rank[u]]
                    if lag[j] <= lag[k] + (pre[at + pos[w] + 1] - pre[at + pos[u] + 1]):
                        keep[j] = False
                        break
    return keep
