"""How much to freeze: the plan with the least predicted time to quality, or none.

What the user buys is time to quality, not step time. A plan whose step takes τ of the unfrozen
step (τ = predicted / baseline) and keeps a share ρ of each step's progress (ρ = 1 − the signal it
drops, as the sensitivity model says) reaches a given loss in τ/ρ of the time (Pollux's goodput).
A larger budget shortens the step and drops more progress, so the best budget is somewhere in
between, and below a certain point nothing pays. `solve_ttq` solves at budgets spread up to the
cap (`SolveOptions.budget`, the accuracy contract: no plan drops more) and keeps the plan with the
smallest τ/ρ; when none is below 1 − `TTQ_MARGIN` (5 %), it answers a plan that freezes nothing and
says why. The prediction is as good as the sensitivity: with `measured` it comes from the probe loss
the profiler measured (`freezeopt.model.sensitivity`).
"""

from __future__ import annotations

import time
from dataclasses import replace

from freezeopt.errors import LpUnsolved
from freezeopt.model.dag import PipelineDag
from freezeopt.solver.lp_arrays import LpCache
from freezeopt.solver.modes import solve
from freezeopt.solver.problem import Signal, SolveOptions, SolveResult

__all__ = ["TTQ_FRACTIONS", "TTQ_MARGIN", "solve_ttq", "ttq_ratio"]

TTQ_FRACTIONS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
"""The budgets tried, as shares of the cap."""
TTQ_MARGIN = 0.05
"""A plan must promise at least this much less time to quality than not freezing. Measured, the
`measured` sensitivity under-predicted the long-run progress a plan loses by up to 1.3× on the
benchmark's regimes (benchmarks/TTQ.md), which at a budget of 0.1 is about 3 % of the time to
quality, and identical runs' step times spread by several per cent on a shared machine: a smaller
promise is within what the model and the measurement cannot tell apart."""


def ttq_ratio(r: SolveResult) -> float:
    """Predicted time to quality of `r`'s plan over not freezing's: τ/ρ (inf where ρ is 0)."""
    t = r.time_to_quality
    return float("inf") if t is None else t


def solve_ttq(
    dag: PipelineDag, signal: Signal, opts: SolveOptions, *, lp_cache: LpCache | None = None
) -> SolveResult:
    """The plan with the least predicted time to quality under the cap `opts.budget` (see the
    module docstring); `opts.time_limit` is shared between the solves."""
    t0 = time.perf_counter()
    cap = opts.budget
    each = opts.time_limit / (len(TTQ_FRACTIONS) + 1)
    tried: list[SolveResult] = []
    failed: list[str] = []
    for f in TTQ_FRACTIONS if cap > 0 else ():
        o = replace(opts, objective="step", budget=cap * f, time_limit=each, write_model=None)
        try:
            tried.append(solve(dag, signal, o, lp_cache=lp_cache))
        except LpUnsolved as e:  # this budget's share of the time was too short: the others may do
            failed.append(f"{cap * f:.3g} ({e})")
    if failed and not tried:
        raise LpUnsolved(
            f"no budget could be solved in its share of --time-limit {opts.time_limit:g} s "
            f"({opts.time_limit / (len(TTQ_FRACTIONS) + 1):.3g} s each): raise --time-limit, or "
            "pass --mode heuristic"
        )
    best = min(tried, key=ttq_ratio, default=None)
    seen = ", ".join(
        f"{r.budget:.3g}: step x{r.predicted_ms / r.baseline_ms if r.baseline_ms > 0 else 1:.3f}, "
        f"progress x{r.progress_ratio:.3f}"
        for r in tried
    )
    if failed:
        seen += f"; not solved in time: {', '.join(failed)}"
    if opts.write_model is not None:
        seen += "; --write-model is not written with --objective ttq (solve at the chosen budget)"
    if best is not None and ttq_ratio(best) < 1.0 - TTQ_MARGIN:
        note = (
            f"time to quality: budget {best.budget:.3g} of the cap {cap:g} predicts "
            f"x{ttq_ratio(best):.3f} the time to the same loss (budgets tried: {seen})"
        )
        return replace(best, solve_seconds=time.perf_counter() - t0, notes=(*best.notes, note))
    nothing = _nothing_frozen(
        best if best is not None else tried[0] if tried else None, dag, signal, opts, each
    )
    why = (
        "no budget up to the cap was tried (the cap is 0)"
        if best is None
        else f"the best plan (budget {best.budget:.3g}) predicts x{ttq_ratio(best):.3f} the "
        f"time to the same loss, not below x{1 - TTQ_MARGIN:g} (budgets tried: {seen})"
    )
    return replace(
        nothing,
        status="no_gain",
        solve_seconds=time.perf_counter() - t0,
        notes=(f"time to quality: freezing does not pay, so nothing is frozen: {why}",),
    )


def _nothing_frozen(
    like: SolveResult | None, dag: PipelineDag, signal: Signal, opts: SolveOptions, seconds: float
) -> SolveResult:
    """The answer that freezes nothing (budget 0, so its bound is the step itself): `like`
    emptied, or a budget-0 solve where nothing was solved."""
    if like is None:
        o = replace(opts, objective="step", budget=0.0, time_limit=seconds, write_model=None)
        return solve(dag, signal, o)
    return replace(
        like,
        frozen={},
        predicted_ms=like.baseline_ms,
        lp_bound_ms=like.baseline_ms,
        gap=0.0,
        signal_dropped=0.0,
        budget=0.0,
        bound_from_lp=True,
    )
