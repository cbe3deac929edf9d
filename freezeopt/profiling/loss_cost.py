"""What freezing costs in loss, measured while profiling: loss-change allocation and branch runs.

Why: a plan that shortens the step by τ but keeps only a share ρ of each step's progress reaches
the same loss in τ/ρ of the time, so ρ must be measured, not assumed (the gradient-noise-scale
model promised 9.4 % of progress lost where the loss curves showed 13–30 %). Two measurements,
both on the probe loss L (the mean loss on a few fixed held-out batches, never trained on):

* loss-change allocation (Lan et al., NeurIPS 2019), per group and measured step:
  A_g = ½(h_t + h_t+1)·Δθ_g, with h the probe loss's gradient before and after the step and Δθ_g
  the update the optimizer really applied to the group. Summed over the groups it equals the
  probe loss's own change to second order (`conservation` checks it): each group's share of the
  progress the step made, which is exactly what freezing the group in every microbatch loses;
* branch runs: from one state (weights and optimizer), the same H steps of data twice — with full
  updates, and with every group frozen in a quarter of each step's microbatches (drawn per step
  and group, rescaled as training rescales). The ratio of their probe-loss drops is the progress
  a partial plan keeps, which the allocation alone cannot say: with a rescaled gradient a group
  frozen in k of M microbatches still moves every step, and loses less than k/M of its share.

`freezeopt.model.sensitivity` (`measured`) turns both into the solver's loss curves.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

__all__ = ["BRANCH_SHARE", "LcaTracker", "branch_count", "branch_frozen", "conservation"]

BRANCH_SHARE = 0.25
"""Share of each step's microbatches every group is frozen in during the frozen branch run: the
range plans under a budget of about 10 % reach."""


class LcaTracker:
    """Per measured stretch (a step, or several), each group's share of the probe loss's change
    (see the module docstring).

    `groups`: this rank's (stage, group, parameters) in profile order. `probe()` must run the probe
    on every rank together (it communicates) and leave its gradient in the parameters' `.grad`,
    returning the probe loss on the last stage's rank (None elsewhere)."""

    def __init__(self, groups: Sequence[tuple[int, str, Sequence[Any]]]) -> None:
        self.groups = list(groups)
        self.losses: list[float | None] = []
        self.changes: dict[tuple[int, str], list[float]] = {(s, g): [] for s, g, _ in groups}
        self._h: list[list[Any]] | None = None
        self._at: list[list[Any]] | None = None

    def _gradient(self, probe: Any) -> tuple[float | None, list[list[Any]]]:
        import torch

        params = [p for _, _, ps in self.groups for p in ps]
        for p in params:
            p.grad = None
        loss = probe()
        h = [
            [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in ps]
            for _, _, ps in self.groups
        ]
        for p in params:
            p.grad = None
        return loss, h

    def start(self, probe: Any, *, keep_weights: bool = False) -> None:
        """The probe before the first measured step; with `keep_weights`, also the groups'
        parameters there, so the next `step` needs no `before` (one stretch of several steps)."""
        loss, self._h = self._gradient(probe)
        self._at = (
            [[p.detach().clone() for p in ps] for _, _, ps in self.groups] if keep_weights else None
        )
        self.losses.append(loss)

    def step(self, probe: Any, before: Sequence[Sequence[Any]] | None = None) -> None:
        """After one or more optimizer steps: `before` holds each group's parameters where the
        previous probe was taken (in `groups` order; by default, once, those
        `start(keep_weights=True)` kept); one trapezoid over the stretch."""
        import torch

        assert self._h is not None, "call start() before the first step"
        if before is None:
            assert self._at is not None, "pass `before`, or start(keep_weights=True) once"
            before, self._at = self._at, None
        loss, h = self._gradient(probe)
        with torch.no_grad():
            for (s, g, ps), h0, h1, b in zip(self.groups, self._h, h, before, strict=True):
                a = 0.0
                for p, x0, x1, old in zip(ps, h0, h1, b, strict=True):
                    a += 0.5 * float(((x0 + x1).double() * (p.detach() - old).double()).sum())
                self.changes[(s, g)].append(a)
        self._h = h
        self.losses.append(loss)


def branch_count(m: int) -> int:
    """Microbatches of `m` (at least 2) each group skips per step in the frozen branch run:
    round(BRANCH_SHARE·m), at least 1."""
    return max(1, round(BRANCH_SHARE * m))


def branch_frozen(step: int, stage: int, group: int, m: int) -> frozenset[int]:
    """The microbatches group `group` of `stage` skips in step `step` of the frozen branch run,
    drawn with a seed of the three, so every rank agrees."""
    rng = random.Random(f"branch/{step}/{stage}/{group}")
    return frozenset(rng.sample(range(m), branch_count(m)))


def conservation(changes: Sequence[float], allocated: Sequence[float]) -> float | None:
    """R² of the per-step probe-loss changes explained by the groups' summed allocations (1 when
    they match exactly), or None with fewer than two steps or no variance."""
    n = len(changes)
    if n < 2 or n != len(allocated):
        return None
    mean = sum(changes) / n
    total = sum((c - mean) ** 2 for c in changes)
    if total <= 0:
        return None
    resid = sum((c - a) ** 2 for c, a in zip(changes, allocated, strict=True))
    return 1.0 - resid / total
