"""Sensitivity estimators: the gradient-noise-scale estimator recovers known values."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from freezeopt.errors import InputError
from freezeopt.formats.profile import GradientTrace
from freezeopt.model.sensitivity import estimate_signal
from tests.conftest import make_profile


def _exact_traces(profile, truth):
    """Traces whose norms equal their expectations: |g_b|² = G² + tr/b, |g_Mb|² = G² + tr/(Mb)."""
    b, m = profile.pipeline.microbatch_size, profile.pipeline.n_microbatches
    out = []
    for st in profile.stages:
        for g in st.groups:
            g2, tr = truth[(st.stage, g.name)]
            out.append(
                GradientTrace(
                    stage=st.stage,
                    group=g.name,
                    microbatch_sq_norms=((g2 + tr / b,) * m,) * 3,
                    step_sq_norms=(g2 + tr / (b * m),) * 3,
                )
            )
    return dataclasses.replace(profile, gradients=tuple(out))


def test_gns_recovers_gradient_and_noise() -> None:
    p = make_profile(microbatches=8, microbatch_size=4)
    truth = {
        (st.stage, g.name): (1.0 + i, 50.0 * (i + 1))
        for st in p.stages
        for i, g in enumerate(st.groups)
    }
    sig = estimate_signal(_exact_traces(p, truth), "gns")
    for row in sig:
        for gs in row:
            g2, tr = truth[(gs.stage, gs.group)]
            assert gs.grad_sq == pytest.approx(g2)
            assert gs.noise_scale == pytest.approx(tr / g2)


def test_gns_losses_are_convex_normalised_and_noise_aware() -> None:
    p = make_profile(microbatches=8, microbatch_size=4)
    # group 0: clean gradient (B small); group 1: noisy (B large); same true-gradient norm
    truth = {
        (st.stage, g.name): (1.0, 0.5 if i == 0 else 500.0)
        for st in p.stages
        for i, g in enumerate(st.groups)
    }
    sig = estimate_signal(_exact_traces(p, truth), "gns")
    assert sum(g.share for row in sig for g in row) == pytest.approx(1.0)
    for row in sig:
        for g in row:
            assert g.loss[0] == 0.0 and g.loss[-1] == pytest.approx(g.share)
            steps = [b - a for a, b in zip(g.loss, g.loss[1:], strict=False)]
            assert all(s2 >= s1 - 1e-12 for s1, s2 in itertools.pairwise(steps)), "convex"
        clean, noisy = row
        # a clean gradient (B = 0.5 samples ≪ batch 32) is saturated: dropping one of 8 microbatches
        # loses almost nothing; a noisy one (B = 500 ≫ 32) loses about 1/8 of its progress
        assert clean.loss[1] / clean.share < 0.01
        assert noisy.loss[1] / noisy.share == pytest.approx(1 / 8, rel=0.1)


@pytest.mark.parametrize("est", ["flat", "numel", "norm"])
def test_linear_estimators(est: str) -> None:
    sig = estimate_signal(make_profile(), est)  # type: ignore[arg-type]
    assert sum(g.share for row in sig for g in row) == pytest.approx(1.0)
    for row in sig:
        for g in row:
            m = len(g.loss) - 1
            assert g.loss == pytest.approx(tuple(g.share * k / m for k in range(m + 1)))


def test_flat_is_uniform() -> None:
    sig = estimate_signal(make_profile(groups=3), "flat")
    shares = {g.share for row in sig for g in row}
    assert len(shares) == 1


def test_missing_traces_say_what_to_do() -> None:
    p = make_profile(trace_steps=0)
    with pytest.raises(InputError, match="--sensitivity numel"):
        estimate_signal(p, "gns")
    estimate_signal(p, "numel")  # works without traces


def test_gns_needs_two_microbatches() -> None:
    with pytest.raises(InputError, match="at least 2 microbatches"):
        estimate_signal(make_profile(ranks=1, microbatches=1), "gns")


def _probed(profile, drops, branch=None, steps=3, noise=100.0):
    """`profile` with a probe whose loss falls by `drops[(stage, group)]` per group over `steps`
    steps (split evenly), gradient traces of noise scale `noise` samples, and the branch runs given
    as (start, full, frozen)."""
    from freezeopt.formats.profile import Branch, Probe

    b, m = profile.pipeline.microbatch_size, profile.pipeline.n_microbatches
    per = {k: -d / steps for k, d in drops.items()}
    traces = tuple(
        GradientTrace(
            stage=st.stage,
            group=g.name,
            # |g_b|² = G² + tr/b, |g_Mb|² = G² + tr/(Mb) with G² = 1, tr = noise
            microbatch_sq_norms=((1.0 + noise / b,) * m,) * steps,
            step_sq_norms=(1.0 + noise / (b * m),) * steps,
            loss_change=(per[(st.stage, g.name)],) * steps,
        )
        for st in profile.stages
        for g in st.groups
    )
    loss = [5.0]
    for _ in range(steps):
        loss.append(loss[-1] + sum(per.values()))
    br = None
    if branch is not None:
        br = Branch(
            steps=20,
            frozen_share=0.25,
            loss_start=branch[0],
            loss_full=branch[1],
            loss_frozen=branch[2],
        )
    return dataclasses.replace(
        profile, gradients=traces, probe=Probe(batches=2, loss=tuple(loss), branch=br)
    )


def test_measured_weights_are_the_groups_shares_of_the_probe_losss_drop() -> None:
    p = make_profile(microbatches=8, microbatch_size=2)
    keys = [(st.stage, g.name) for st in p.stages for g in st.groups]
    drops = {k: 0.1 * (i + 1) for i, k in enumerate(keys)}
    drops[keys[-1]] = -0.05  # this group raised the probe loss: the floor weight
    sig = estimate_signal(_probed(p, drops), "measured")
    gns = estimate_signal(_probed(p, drops), "gns")
    total = sum(max(d, 0.0) for d in drops.values())
    for row, grow in zip(sig, gns, strict=True):
        for g, gg in zip(row, grow, strict=True):
            want = max(drops[(g.stage, g.group)], 0.0) / total
            assert g.share == pytest.approx(max(want, 1e-9))
            assert g.noise_scale == pytest.approx(100.0) == gg.noise_scale
            # linear in the microbatches frozen, on the measured weight
            assert g.loss == pytest.approx(tuple(g.share * k / 8 for k in range(9)))


def test_the_branch_runs_only_ever_make_freezing_dearer() -> None:
    from freezeopt.model.sensitivity import measured_branch

    p = make_profile(microbatches=8, microbatch_size=2)
    drops = {(st.stage, g.name): 0.2 for st in p.stages for g in st.groups}
    plain = estimate_signal(_probed(p, drops), "measured")
    # 2 of 8 microbatches frozen lose a quarter of a group's progress (linear); a branch that
    # kept more (lost 10 %) changes nothing
    cheap = _probed(p, drops, branch=(2.0, 1.0, 1.1))
    assert measured_branch(cheap) == pytest.approx((0.25, 0.1))
    assert estimate_signal(cheap, "measured") == plain
    # a branch that lost 40 %: every curve scaled by 40 / 25
    dear = estimate_signal(_probed(p, drops, branch=(2.0, 1.0, 1.4)), "measured")
    predicted = sum(g.loss[2] for row in plain for g in row)
    assert predicted == pytest.approx(0.25)
    for row, prow in zip(dear, plain, strict=True):
        for g, pg in zip(row, prow, strict=True):
            assert g.loss == pytest.approx(tuple(v * 0.4 / predicted for v in pg.loss))
            steps = [b - a for a, b in zip(g.loss, g.loss[1:], strict=False)]
            assert all(s2 >= s1 - 1e-12 for s1, s2 in itertools.pairwise(steps)), "convex"


def test_measured_needs_the_probe() -> None:
    with pytest.raises(InputError, match="re-profile") as e:
        estimate_signal(make_profile(), "measured")
    assert "--sensitivity gns" in str(e.value)
