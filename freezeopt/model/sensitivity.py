"""What freezing a parameter group costs in gradient signal, estimated from profiled gradient traces.

The solver needs, for every (stage, group), the share of one step's expected progress that is
lost when the group is frozen in k of the step's M microbatches. Each estimator is a *weight*
per group (its share of the step's progress; all groups sum to 1) times a *curve* (the fraction
of that group's progress lost at k):

* `gns` (default) — curve from the gradient noise scale of McCandlish et al. (2018), weight from
  the parameter count. From the mean squared norm of per-microbatch gradients (batch b) and the
  squared norm of the step's mean gradient (batch M·b), unbiased estimates of the true-gradient
  norm |G|² and the noise tr(Σ) follow:
      |G|² ≈ (Mb·|g_Mb|² − b·|g_b|²) / (Mb − b),   tr(Σ) ≈ (|g_b|² − |g_Mb|²) / (1/b − 1/(Mb)).
  One step with n samples makes progress ∝ n / (n + B), B = tr(Σ)/|G|². Freezing the group in k
  microbatches leaves n = (M−k)·b (the runtime rescales the rest to stay unbiased), so the group
  loses 1 − P((M−k)b)/P(Mb) of its progress: convex in k, 0 at k = 0, all of it at k = M. A group
  with a clean gradient (B ≪ M·b) is saturated and loses little when a few microbatches are
  dropped; a noisy one (B ≫ M·b) loses in proportion to the samples it misses. The weight is the
  group's share of the parameters, because Adam-style optimizers normalise every parameter's step:
  raw |G|² shares are dominated by a few large-gradient layers (on the built-in job the output
  head holds 92 % of |G|²) and would call every other block nearly free to freeze.
  Estimates average numerator and denominator over steps (ratio of means) and clamp |G|² to a
  small positive floor where noise swamps it.
* `measured` — from the profile's probe loss (`freezeopt.profiling.loss_cost`): weight = the
  group's share of the probe loss's measured drop over the measured steps (its loss-change
  allocation, summed; a group that raised the loss gets the floor weight), which is what freezing
  it in every microbatch loses; curve = linear, k/M. Why not `gns`'s: the noise scale grows as
  training goes on (McCandlish et al.), and a profile measures it in a run's first steps, where it
  is smallest and dropping microbatches looks free; linear is the curve's limit once the noise
  dominates, which is where a run spends most of its steps. (Measured: on the built-in job from
  scratch a plan chosen on `gns`-shaped curves froze 61 % of the weight-gradient work and never
  reached the no-freeze loss; benchmarks/TTQ-gns-curve.md.) The branch runs (every group frozen in a share x
  of the microbatches kept 1 − ℓ of the progress) check it: where ℓ exceeds what the curves
  predict for that plan, every curve is scaled up by their ratio κ; never down.
* `gns-raw` — the same curve, weighted by |G|²·Mb/(Mb + B): McCandlish's progress for plain SGD.
* `norm` — linear curve, weighted by the group's share of the step gradient's squared norm.
* `numel` — linear curve, weighted by the parameter count.
* `flat` — linear curve, every group the same weight (with one group per stage and a per-stage cap
  this makes the LP TimelyFreeze's).

The budget ε then reads "lose at most ε of one step's expected progress".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from freezeopt.errors import InputError
from freezeopt.formats.profile import Profile

__all__ = [
    "ESTIMATORS",
    "Estimator",
    "GroupSignal",
    "estimate_signal",
    "measured_branch",
    "measured_check",
]

Estimator = Literal["gns", "measured", "gns-raw", "norm", "numel", "flat"]
ESTIMATORS: tuple[Estimator, ...] = ("gns", "measured", "gns-raw", "norm", "numel", "flat")
_FLOOR = 1e-9


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupSignal:
    """The signal model of one parameter group."""

    stage: int
    group: str
    share: float
    """Share of one step's expected progress this group carries (all groups sum to 1)."""
    loss: tuple[float, ...]
    """loss[k]: share of the step's progress lost when frozen in k of M microbatches (convex, loss[0] = 0)."""
    grad_sq: float | None = None
    """`gns` only: estimated true-gradient squared norm |G|²."""
    noise_scale: float | None = None
    """`gns` only: estimated noise scale B = tr(Σ)/|G|², in samples."""


def estimate_signal(
    profile: Profile, estimator: Estimator = "gns"
) -> tuple[tuple[GroupSignal, ...], ...]:
    """Per stage, per group (in profile order), the signal model under `estimator`."""
    if estimator not in ESTIMATORS:
        raise InputError(
            f"unknown sensitivity estimator {estimator!r}; use one of {', '.join(ESTIMATORS)}"
        )
    m = profile.pipeline.n_microbatches
    if estimator == "measured":
        return _measured(profile, m)
    keys = [(st.stage, g.name) for st in profile.stages for g in st.groups]
    traces = {(t.stage, t.group): t for t in profile.gradients}
    curved = estimator in ("gns", "gns-raw")
    if curved or estimator == "norm":
        missing = [k for k in keys if k not in traces or not traces[k].step_sq_norms]
        if missing:
            stage, group = missing[0]
            raise InputError(
                f"sensitivity {estimator!r} needs gradient traces, but the profile has none for stage {stage} group "
                f"{group!r}; re-profile, or pass --sensitivity numel"
            )
    if curved and m < 2:
        raise InputError(
            f"sensitivity {estimator!r} needs at least 2 microbatches per step; pass --sensitivity numel"
        )

    raw: dict[tuple[int, str], tuple[float, float | None, float | None]] = {}
    b = float(profile.pipeline.microbatch_size)
    for st in profile.stages:
        for g in st.groups:
            k = (st.stage, g.name)
            if estimator == "flat":
                raw[k] = (1.0, None, None)
            elif estimator == "numel":
                raw[k] = (float(g.numel), None, None)
            elif estimator == "norm":
                t = traces[k]
                raw[k] = (sum(t.step_sq_norms) / len(t.step_sq_norms), None, None)
            else:
                g2, noise = _gns(traces[k].microbatch_sq_norms, traces[k].step_sq_norms, b, m)
                weight = g2 * m * b / (m * b + noise) if estimator == "gns-raw" else float(g.numel)
                raw[k] = (weight, g2, noise / g2)
    total = sum(max(v[0], 0.0) for v in raw.values())
    out = []
    for st in profile.stages:
        row = []
        for g in st.groups:
            p, g2_est, bnoise = raw[(st.stage, g.name)]
            share = max(p / total if total > 0 else 1.0 / len(keys), _FLOOR)
            if curved:
                assert bnoise is not None
                loss = tuple(share * f for f in _gns_curve(m, b, bnoise))
            else:
                loss = tuple(share * k / m for k in range(m + 1))
            row.append(
                GroupSignal(
                    stage=st.stage,
                    group=g.name,
                    share=share,
                    loss=loss,
                    grad_sq=g2_est,
                    noise_scale=bnoise,
                )
            )
        out.append(tuple(row))
    return tuple(out)


def _gns(
    mb_sq: tuple[tuple[float, ...], ...], step_sq: tuple[float, ...], b: float, m: int
) -> tuple[float, float]:
    """Return (|G|², tr Σ) estimated from per-microbatch and per-step squared norms (ratio of means)."""
    small = [sum(row) / len(row) for row in mb_sq if row]
    if not small:
        raise InputError(
            "gradient trace has no per-microbatch norms; re-profile, or pass --sensitivity norm"
        )
    s_small = sum(small) / len(small)
    s_big = sum(step_sq) / len(step_sq)
    big_b = m * b
    g2 = (big_b * s_big - b * s_small) / (big_b - b)
    noise = (s_small - s_big) / (1.0 / b - 1.0 / big_b)
    noise = max(noise, 0.0)
    g2 = max(g2, 1e-3 * max(s_big, 1e-30))
    return g2, noise


def measured_branch(profile: Profile) -> tuple[float, float] | None:
    """The branch runs' point (x, ℓ): every group frozen in a share x of the microbatches kept
    1 − ℓ of the full run's progress; None where the profile has none, or the full run made no
    progress."""
    br = profile.probe.branch if profile.probe is not None else None
    if br is None or br.loss_start - br.loss_full <= 0:
        return None
    kept = (br.loss_start - br.loss_frozen) / (br.loss_start - br.loss_full)
    return br.frozen_share, 1.0 - kept


_Row = list[tuple[float, tuple[float, ...], float, float]]
"""Per group of a stage: (weight, curve over k, |G|², noise scale)."""


def _measured(profile: Profile, m: int) -> tuple[tuple[GroupSignal, ...], ...]:
    rows = _measured_rows(profile, m)
    # the branch runs may only make freezing dearer than the model says, never cheaper (one
    # short run early in training is noisy, and partial freezing costs more later)
    kappa = 1.0
    check = _branch_check(profile, rows, m)
    if check is not None and check[0] > 0:
        kappa = max(1.0, check[1] / check[0])
    return tuple(
        tuple(
            GroupSignal(
                stage=st.stage,
                group=g.name,
                share=share,
                loss=tuple(share * kappa * f for f in curve),
                grad_sq=g2,
                noise_scale=noise,
            )
            for g, (share, curve, g2, noise) in zip(st.groups, row, strict=True)
        )
        for st, row in zip(profile.stages, rows, strict=True)
    )


def _measured_rows(profile: Profile, m: int) -> list[_Row]:
    """`measured`'s weights and curves, per stage (see the module docstring), before the
    branch runs' check."""
    traces = {(t.stage, t.group): t for t in profile.gradients}
    keys = [(st.stage, g.name) for st in profile.stages for g in st.groups]
    missing = [
        k
        for k in keys
        if k not in traces or not traces[k].loss_change or not traces[k].step_sq_norms
    ]
    if profile.probe is None or missing:
        stage, group = missing[0] if missing else keys[0]
        raise InputError(
            f"sensitivity 'measured' needs the probe loss, but the profile has none for stage "
            f"{stage} group {group!r}; re-profile with this freezeopt (probe_batches > 0), or pass "
            "--sensitivity gns"
        )
    if m < 2:
        raise InputError(
            "sensitivity 'measured' needs at least 2 microbatches per step; pass --sensitivity numel"
        )
    drop = {k: max(-sum(traces[k].loss_change), 0.0) for k in keys}
    total = sum(drop.values())
    b = float(profile.pipeline.microbatch_size)
    rows: list[_Row] = []
    for st in profile.stages:
        row: _Row = []
        for g in st.groups:
            k = (st.stage, g.name)
            share = max(drop[k] / total if total > 0 else 1.0 / len(keys), _FLOOR)
            g2, noise = _gns(traces[k].microbatch_sq_norms, traces[k].step_sq_norms, b, m)
            row.append((share, tuple(k / m for k in range(m + 1)), g2, noise / g2))
        rows.append(row)
    return rows


def _branch_check(profile: Profile, rows: Sequence[_Row], m: int) -> tuple[float, float] | None:
    """(predicted, measured) share of progress the branch runs' frozen plan lost, or None."""
    point = measured_branch(profile)
    if point is None:
        return None
    x, ell = point
    kb = round(x * m)
    return sum(share * curve[kb] for row in rows for share, curve, _, _ in row), ell


def measured_check(profile: Profile) -> tuple[float, float] | None:
    """What the `measured` sensitivity's curves predict the branch runs' frozen plan loses (a
    share of the full run's progress, before any scaling up) against what it lost: (predicted,
    measured); None where the profile has no branch runs."""
    m = profile.pipeline.n_microbatches
    return _branch_check(profile, _measured_rows(profile, m), m)


def _gns_curve(m: int, b: float, bnoise: float) -> tuple[float, ...]:
    """Share of a group's progress lost when frozen in k = 0…m microbatches of size b, with noise
    scale `bnoise` (samples): 1 − P((m−k)b)/P(mb), P(n) = n/(n + B); all of it at k = m."""
    full = m * b / (m * b + bnoise)
    return tuple(
        1.0 - ((m - k) * b / ((m - k) * b + bnoise)) / full if k < m else 1.0 for k in range(m + 1)
    )
