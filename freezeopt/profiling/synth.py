"""Synthetic profiles: any torch schedule (or CSV order), any size, seeded costs and gradients.

`freezeopt synth` writes a profile without running a model, for trying the solver, testing it and
benchmarking it at scales no CPU box can run. The per-rank action order still comes from torch's
own schedule classes (through `freezeopt.torchpp.adapter`) or from a CSV file in torch's format, so the
DAG is the one torch would execute. Costs follow a simple, documented model:

* stage s has a random factor in [1 − jitter, 1 + jitter] (the last stage is also multiplied by
  `last_stage_factor`, as a large-vocabulary head makes it); F costs `forward_ms`, a full B costs
  `backward_ms`, of which `weight_share` is weight-gradient work split at random among the
  stage's groups (I is the rest; W is the weight part);
* as torch does, the first stage of a split-backward schedule runs its whole backward in W (I ≈ 0);
* every action gets independent noise of relative size `noise`;
* gradient traces come from a per-group true-gradient norm and noise scale (lognormal), sampled
  the way real per-microbatch and per-step gradient norms scatter.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import platform
import random
from dataclasses import asdict, dataclass
from pathlib import Path

from freezeopt import __version__
from freezeopt.actions import Action, parse_action
from freezeopt.errors import InputError, option
from freezeopt.fileio import read_text_file
from freezeopt.formats.profile import (
    MAX_MICROBATCH_SIZE,
    MAX_MICROBATCHES,
    MAX_MS,
    MAX_RANKS,
    ActionCost,
    GradientTrace,
    GroupProfile,
    Lag,
    Pipeline,
    Profile,
    Provenance,
    RankProfile,
    StageProfile,
    Stat,
)
from freezeopt.torchpp.adapter import CSV_MAX_BYTES

__all__ = ["SynthOptions", "check_csv_counts", "load_csv_schedule", "synth_profile"]

MAX_GROUPS = 1024
MAX_TRACE_STEPS = 1024
MAX_SYNTH_VALUES = 2**28
"""Bounds checked before anything is allocated: the largest profile the solver benchmarks use
(64 stages × 256 microbatches × 8 groups × 4 trace steps) holds 2^19 values."""
MAX_SYNTH_MS = MAX_MS / 10  # 1e8, as the messages say
"""Largest stage cost (`forward_ms`, `backward_ms` times the stage factors) and lag: the noise on
top of them (at most 0.5 relative) keeps every time in the profile within `MAX_MS`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SynthOptions:
    """Options of `freezeopt synth` (see the module docstring for the cost model)."""

    schedule: str = "1F1B"
    """torch schedule name, or a path to a CSV file (one row per rank, e.g. `0F0,0I0,0W0`)."""
    ranks: int = 4
    stages_per_rank: int | None = None
    """Default: 1 for GPipe/1F1B, 2 for multi-stage schedules."""
    microbatches: int = 8
    microbatch_size: int = 4
    groups: int = 4
    """Parameter groups per stage."""
    forward_ms: float = 10.0
    backward_ms: float = 20.0
    weight_share: float = 0.5
    jitter: float = 0.1
    last_stage_factor: float = 1.0
    noise: float = 0.02
    lag_ms: float = 0.1
    trace_steps: int = 4
    seed: int = 0

    def __post_init__(self) -> None:
        _check(self)


def load_csv_schedule(path: str | Path) -> tuple[tuple[Action, ...], ...]:
    """Per-rank compute actions from a CSV file in torch's format (one row per rank)."""
    p = Path(path)
    text = read_text_file(
        p, what="schedule CSV", limit=CSV_MAX_BYTES, missing_hint="check the path"
    )
    rows = list(csv.reader(text.splitlines()))
    out = []
    for i, row in enumerate(rows):
        acts = []
        for cell in row:
            if not cell.strip():
                continue
            try:
                acts.append(parse_action(cell))
            except ValueError as e:
                raise InputError(f"{p}, row {i + 1}: {e}") from None
        out.append(tuple(acts))
    if not out or not any(out):
        raise InputError(f"{p}: no actions; write one row per rank, e.g. 0F0,0F1,0B0,0B1")
    return tuple(out)


def check_csv_counts(
    path: str | Path, *, ranks: int | None, microbatches: int | None, stages_per_rank: int | None
) -> None:
    """A CSV schedule sets its own counts: refuse options that say otherwise (given ones that
    agree with the file are fine)."""
    acts = load_csv_schedule(path)
    n_ranks = len(acts)
    n_stages = max(a.stage for row in acts for a in row) + 1
    has = {
        "--ranks": (ranks, n_ranks),
        "--microbatches": (microbatches, max(a.microbatch for row in acts for a in row) + 1),
        "--stages-per-rank": (stages_per_rank, n_stages / n_ranks),
    }
    for flag, (given, own) in has.items():
        if given is not None and given != own:
            raise InputError(
                f"{flag} {given}, but the CSV schedule {path} has {own:g}; leave {flag} out "
                "(the file sets it)"
            )


def synth_profile(opts: SynthOptions) -> Profile:
    """Build a synthetic profile from `opts` (deterministic for a given seed)."""
    if opts.schedule.lower().endswith(".csv"):
        rank_acts = load_csv_schedule(opts.schedule)
        runs: tuple[tuple[tuple[Action, ...], ...], ...] = tuple(() for _ in rank_acts)
        sched_name = f"csv:{Path(opts.schedule).name}"
    else:
        from freezeopt.torchpp.adapter import (
            default_stages_per_rank,
            schedule_actions,
            schedule_composites,
        )

        spr = opts.stages_per_rank or default_stages_per_rank(opts.schedule)
        shape = dict(world_size=opts.ranks, stages_per_rank=spr, n_microbatches=opts.microbatches)
        rank_acts = schedule_actions(opts.schedule, **shape)
        runs = schedule_composites(opts.schedule, **shape)
        sched_name = opts.schedule
    all_acts = [a for r in rank_acts for a in r]
    n_st = max(a.stage for a in all_acts) + 1
    n_mb = max(a.microbatch for a in all_acts) + 1
    stage_rank = {a.stage: r for r, acts in enumerate(rank_acts) for a in acts}
    missing = [s for s in range(n_st) if s not in stage_rank]
    if missing:
        raise InputError(
            f"no rank runs stage {missing[0]}; every stage 0..{n_st - 1} needs actions"
        )
    split = {a.stage for a in all_acts if a.kind == "I"}
    rng = random.Random(opts.seed)

    stages, w_of = [], {}
    f_of, i_of = {}, {}
    for s in range(n_st):
        factor = rng.uniform(1 - opts.jitter, 1 + opts.jitter) * (
            opts.last_stage_factor if s == n_st - 1 else 1.0
        )
        f_of[s] = opts.forward_ms * factor
        w_total = opts.backward_ms * factor * opts.weight_share
        i_of[s] = opts.backward_ms * factor - w_total
        shares = [rng.gammavariate(2.0, 1.0) for _ in range(opts.groups)]
        tot = sum(shares)
        groups = []
        for gi, sh in enumerate(shares):
            c = w_total * sh / tot
            groups.append(
                GroupProfile(
                    name=f"s{s}.g{gi}",
                    params=(f"s{s}.g{gi}.weight", f"s{s}.g{gi}.bias"),
                    numel=max(1, round(c * 1e5)),
                    weight_grad_ms=_stat(c, opts.noise, opts.trace_steps or 1),
                )
            )
        w_of[s] = sum(g.weight_grad_ms.median for g in groups)
        stages.append(StageProfile(stage=s, rank=stage_rank[s], groups=tuple(groups)))

    costs = []
    n = max(opts.trace_steps, 1)
    for a in sorted(all_acts, key=lambda a: (a.stage, a.microbatch, "FBIW".index(a.kind))):
        s = a.stage
        jit = max(0.05, 1 + rng.gauss(0, opts.noise))
        if a.kind == "F":
            c = f_of[s] * jit
        elif a.kind == "B":
            c = i_of[s] * jit + w_of[s]
        elif a.kind == "I":
            c = 0.01 * i_of[s] * jit if s == 0 and s in split else i_of[s] * jit
        else:
            extra = i_of[s] * jit if s == 0 else 0.0  # torch runs stage 0's whole backward in W
            c = w_of[s] * max(1.0, jit) + extra
        costs.append(ActionCost(action=str(a), cost_ms=_stat(c, opts.noise, n)))

    lags = []
    for s in range(n_st - 1):
        if stage_rank[s] != stage_rank[s + 1]:
            lags.append(
                Lag(src_stage=s, dst_stage=s + 1, kind="F", ms=_stat(opts.lag_ms, opts.noise, n))
            )
            lags.append(
                Lag(src_stage=s + 1, dst_stage=s, kind="B", ms=_stat(opts.lag_ms, opts.noise, n))
            )

    traces = []
    if opts.trace_steps > 0:
        b = opts.microbatch_size
        for st in stages:
            for g in st.groups:
                g2 = rng.lognormvariate(0.0, 1.0)
                noise_scale = (
                    rng.lognormvariate(0.0, 1.5) * n_mb * b
                )  # B in samples, around the batch size
                tr = g2 * noise_scale
                mb_rows, steps = [], []
                for _ in range(opts.trace_steps):
                    mb_rows.append(tuple(_chi(rng, g2 + tr / b) for _ in range(n_mb)))
                    steps.append(_chi(rng, g2 + tr / (b * n_mb)))
                traces.append(
                    GradientTrace(
                        stage=st.stage,
                        group=g.name,
                        microbatch_sq_norms=tuple(mb_rows),
                        step_sq_norms=tuple(steps),
                    )
                )

    job = asdict(opts)
    if sched_name.startswith("csv:"):  # the file, not the options, says how many
        job.update(ranks=len(rank_acts), microbatches=n_mb, stages_per_rank=None)
    job_json = json.dumps(job, sort_keys=True)
    return Profile(
        schema_version=1,
        provenance=Provenance(
            source="synth",
            freezeopt=__version__,
            python=platform.python_version(),
            job=job,
            job_sha256=hashlib.sha256(job_json.encode()).hexdigest(),
            seed=opts.seed,
            steps_measured=opts.trace_steps,
        ),
        pipeline=Pipeline(
            schedule=sched_name,
            world_size=len(rank_acts),
            n_stages=n_st,
            n_microbatches=n_mb,
            microbatch_size=opts.microbatch_size,
        ),
        ranks=tuple(
            RankProfile(
                rank=r,
                actions=tuple(str(a) for a in acts),
                composites=tuple(tuple(str(a) for a in run) for run in runs[r]),
            )
            for r, acts in enumerate(rank_acts)
        ),
        actions=tuple(costs),
        stages=tuple(stages),
        lags=tuple(lags),
        gradients=tuple(traces),
    )


def _stat(x: float, noise: float, n: int) -> Stat:
    return Stat(median=x, p10=x * max(0.0, 1 - 1.28 * noise), p90=x * (1 + 1.28 * noise), n=n)


def _chi(rng: random.Random, mean: float, dof: int = 64) -> float:
    """A squared norm around `mean`: mean × χ²(dof)/dof."""
    return mean * rng.gammavariate(dof / 2, 2.0) / dof


def _check(o: SynthOptions) -> None:
    """Refuse values out of range: an `InputError` naming the field."""
    numbers = ("forward_ms", "backward_ms", "weight_share", "jitter", "noise", "last_stage_factor")
    for name in (*numbers, "lag_ms"):
        if not math.isfinite(getattr(o, name)):
            raise InputError(f"{option(name)} must be a finite number")
    positive = {
        "ranks": o.ranks,
        "microbatches": o.microbatches,
        "microbatch_size": o.microbatch_size,
        "groups": o.groups,
    }
    if o.stages_per_rank is not None:
        positive["stages_per_rank"] = o.stages_per_rank
    for k, v in positive.items():
        if v < 1:
            raise InputError(f"{option(k)} must be at least 1 (got {v})")
    if o.forward_ms <= 0 or o.backward_ms <= 0:
        raise InputError(f"{option('forward_ms')} and {option('backward_ms')} must be positive")
    if not 0 < o.weight_share <= 1:
        raise InputError(f"{option('weight_share')} must be in (0, 1] (got {o.weight_share})")
    if not 0 <= o.jitter < 1 or not 0 <= o.noise < 0.5:
        raise InputError(f"{option('jitter')} must be in [0, 1) and {option('noise')} in [0, 0.5)")
    if o.last_stage_factor <= 0 or o.lag_ms < 0 or o.trace_steps < 0:
        raise InputError(
            f"{option('last_stage_factor')} must be positive, {option('lag_ms')} and {option('trace_steps')} non-negative"
        )
    biggest = max(o.forward_ms, o.backward_ms) * o.last_stage_factor * (1 + o.jitter)
    room = "a tenth of the 1e9 ms limit on a profile's times (docs/profile.md), leaving room for the noise"
    if biggest > MAX_SYNTH_MS:
        raise InputError(
            f"the largest stage cost, max({option('forward_ms')}, {option('backward_ms')}) × "
            f"{option('last_stage_factor')} × (1 + {option('jitter')}), is {biggest:g} ms; it "
            f"must be at most 1e8 ms: {room}"
        )
    if o.lag_ms > MAX_SYNTH_MS:
        raise InputError(f"{option('lag_ms')} must be at most 1e8 ms (got {o.lag_ms:g}): {room}")
    for k, most in (
        ("ranks", MAX_RANKS),
        ("stages_per_rank", MAX_RANKS),
        ("microbatches", MAX_MICROBATCHES),
        ("microbatch_size", MAX_MICROBATCH_SIZE),
        ("groups", MAX_GROUPS),
        ("trace_steps", MAX_TRACE_STEPS),
    ):
        v = getattr(o, k)
        if v is not None and v > most:
            raise InputError(f"{option(k)} must be at most {most:,} (got {v:,})")
    stages = o.ranks * (o.stages_per_rank or 2)
    size = stages * o.microbatches * max(1, o.groups) * max(1, o.trace_steps)
    if size > MAX_SYNTH_VALUES:
        raise InputError(
            f"{option('ranks')} × stages × {option('microbatches')} × {option('groups')} × "
            f"{option('trace_steps')} is {size:,}: over the {MAX_SYNTH_VALUES:,} values a "
            "synthetic profile may hold; make it smaller"
        )
