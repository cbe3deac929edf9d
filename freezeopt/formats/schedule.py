"""The schedule file (version 1): what `freezeopt solve` writes and teams commit to git.

YAML, `schema_version` first, written deterministically (same inputs → byte-identical file: no
timestamps, numbers rounded, keys in a fixed order) so `git diff` shows real changes only, and
validated on load (unknown keys rejected, one clear line per problem). It says which pipeline it
fits, the training phases the runtime follows, the prediction, and per stage which groups are
frozen in which microbatches, in a compact form: `blocks.3: 0-2,5` freezes group `blocks.3` of
that stage in microbatches 0, 1, 2 and 5. `docs/schedule.md` describes every field.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from freezeopt.errors import InputError, MismatchError, option, short
from freezeopt.fileio import atomic_write_text, invalid_file, load_yaml_file
from freezeopt.formats.fingerprint import FINGERPRINT_PATTERN
from freezeopt.formats.profile import MAX_MICROBATCHES, MAX_RANKS, MAX_STEP_MS, Profile

__all__ = [
    "SCHEDULE_VERSION",
    "Drift",
    "Phases",
    "PipelineShape",
    "Progression",
    "Realisation",
    "Schedule",
    "check_fits",
    "check_phase_flags",
    "dump_schedule",
    "format_microbatches",
    "load_schedule",
    "microbatch_ranges",
    "parse_microbatches",
    "parse_schedule",
    "pipeline_difference",
    "profile_fingerprints",
    "save_schedule",
    "schedule_json_schema",
    "schedule_sha256",
    "with_phases",
]

SCHEDULE_VERSION = 1
SCHEDULE_MAX_BYTES = 16 * 2**20
_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)
Share = Annotated[float, Field(ge=0, le=1)]
NonNeg = Annotated[float, Field(ge=0)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleProvenance:
    """How the schedule was made."""

    __pydantic_config__ = _CONFIG
    freezeopt: str
    """freezeopt version that solved it."""
    profile_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    """Content hash of the profile it was solved from."""
    profile_source: str
    """`measured` or `synth`."""
    mode: str
    """`milp`, `lp` or `heuristic`; in `freezeopt compare`'s baselines, the policy's name."""
    solver: str
    """`cbc` or `highs`."""
    status: str
    """Solver outcome: `optimal`, `time_limit`, `heuristic`, `heuristic_fallback`, `no_gain`
    (`ttq`: nothing frozen, freezing does not pay), or `policy` for `freezeopt compare`'s
    baselines."""
    sensitivity: str
    """Sensitivity estimator (`gns`, `measured`, `gns-raw`, `norm`, `numel`, `flat`)."""
    budget: Share
    """Largest share of one step's expected progress freezing may drop (with the `ttq` objective:
    the budget it chose, at most `budget_cap`)."""
    group_cap: Share
    """Largest share of microbatches in which one group may be frozen."""
    stage_cap: Share | None = None
    """Per-stage mean freeze-ratio cap, if used."""
    tolerance: Share = 0.0
    """Step-time tolerance of phase 2."""
    objective: Literal["step", "ttq"] = "step"
    """`step`: the shortest step under the budget. `ttq`: the least predicted time to quality
    under the cap `budget_cap` (`freezeopt.solver.ttq`); absent in files for `step`."""
    budget_cap: Share | None = None
    """`ttq` only: the cap the budget was chosen under (`solve --budget`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulePipeline:
    """The pipeline the schedule is valid for; loading it against another is an error."""

    __pydantic_config__ = _CONFIG
    schedule: str
    """torch schedule name or `csv:<file>`."""
    world_size: Annotated[int, Field(ge=1, le=MAX_RANKS)]
    n_stages: Annotated[int, Field(ge=1, le=MAX_RANKS)]
    n_microbatches: Annotated[int, Field(ge=1, le=MAX_MICROBATCHES)]
    stage_to_rank: tuple[Annotated[int, Field(ge=0)], ...]
    """Rank of each stage."""
    groups: tuple[tuple[str, ...], ...]
    """Per stage, its parameter group names."""
    fingerprints: (
        tuple[tuple[Annotated[str, Field(pattern=FINGERPRINT_PATTERN)], ...], ...] | None
    ) = None
    """Per stage, per group of `groups`: the fingerprint of the group's parameters
    (`<element count>-<16 hex digits>`), copied from the profile it was solved from. `train`,
    `FreezeController.check_groups` (which `enable_freezing` calls) and `validate --profile` refuse a
    model or profile whose groups hold other parameters (another width, say). Absent where the
    profile had none for some group (`freezeopt synth`'s, profiles written before freezeopt
    recorded them): then only the group names are checked."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Drift:
    """Drift rules the runtime applies; on drift it falls back to full updates."""

    __pydantic_config__ = _CONFIG
    loss_rise: NonNeg = 0.05
    """Fall back when the loss exceeds its recent trend (the losses of steps where no rule
    fired) by this relative amount."""
    grad_norm_spike: NonNeg = 5.0
    """Fall back when a group's gradient norm exceeds its running median by this factor."""
    step_time_error: NonNeg = 0.25
    """Fall back (and flag the schedule as stale) when measured step time is off the prediction by this share."""
    fallback_steps: Annotated[int, Field(ge=1)] = 20
    """Steps of full updates after a drift."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Realisation:
    """How the runtime turns the file into frozen parameters."""

    __pydantic_config__ = _CONFIG
    kind: Literal["groups", "random_tensors"] = "groups"
    """`groups`: freeze whole groups as `frozen` lists them (fractional `ratios` are rounded per
    microbatch with a seeded draw). `random_tensors`: TimelyFreeze's realisation — in microbatch m
    of stage s, freeze round(r·n) of the stage's n parameter tensors chosen at random, r being the
    stage's ratio for m in `ratios` (or 1 where `frozen` lists the group)."""
    redraw_every: Annotated[int, Field(ge=1)] = 10
    """`random_tensors`: draw a new random choice every this many steps."""
    rescale: bool = True
    """Rescale a partly frozen group's gradient by M/(M−k) (TimelyFreeze does not)."""
    seed: int = 0
    """Seed of the random draws."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Progression:
    """Freezing that grows over training, whole groups from the model's first on (a frozen
    prefix), on top of `frozen` — the rules of progressive-freezing systems, for comparison:

    * `linear` (Composer's LayerFreezing): from `start` of `total_steps` on, the first
      ⌊G·level·(f − start)/(1 − start)⌋ of the G groups are frozen at training fraction f, at most
      G − 1;
    * `gradient_change` (AutoFreeze's rule): every `every` freezing steps, each group's mean
      gradient norm over the window is compared with the window before; the prefix grows over
      the next groups while their relative change is at or below the `percentile`-th percentile
      of the changes of the groups still trained; the last group is never frozen.

    A frozen prefix group is frozen in every microbatch of every later step, whatever the phase
    (`grad = None`), the last group always trains, and stages frozen whole truncate the backward of
    the stage after them."""

    __pydantic_config__ = _CONFIG
    kind: Literal["linear", "gradient_change"]
    start: Share = 0.5
    """`linear`: the training fraction at which freezing starts."""
    level: Share = 1.0
    """`linear`: the share of the groups frozen at the end of training."""
    total_steps: Annotated[int, Field(ge=1)] = 1
    """`linear`: the steps the fractions are of (a run may go on past them: nothing more freezes)."""
    every: Annotated[int, Field(ge=1)] = 10
    """`gradient_change`: the window, in freezing steps, between two decisions."""
    percentile: Share = 0.5
    """`gradient_change`: the threshold, as a quantile of the trained groups' changes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Phases:
    """Training phases the runtime follows."""

    __pydantic_config__ = _CONFIG
    warmup_steps: Annotated[int, Field(ge=0)] = 100
    """Full updates for this many optimizer steps before freezing starts."""
    full_update_every: Annotated[int, Field(ge=0)] = 50
    """During freezing, one full-update window every this many steps (0: never)."""
    full_update_steps: Annotated[int, Field(ge=1)] = 1
    """Length of each full-update window in steps."""
    drift: Drift = field(default_factory=Drift)


def check_phase_flags(warmup_steps: int | None, full_update_every: int | None) -> None:
    """The command-line phase options (`--warmup-steps`, `--full-update-every`) a schedule can
    hold: checked where they are given, so that no command writes a file the loaders reject."""
    if warmup_steps is not None and warmup_steps < 0:
        raise InputError(f"{option('warmup_steps')} must not be negative")
    if full_update_every is not None and full_update_every < 0:
        raise InputError(f"{option('full_update_every')} must not be negative (0: never)")


def with_phases(
    schedule: Schedule, *, warmup_steps: int | None = None, full_update_every: int | None = None
) -> Schedule:
    """`schedule` with its warm-up and full-update period overridden where given (checked)."""
    check_phase_flags(warmup_steps, full_update_every)
    changes: dict[str, Any] = {}
    if warmup_steps is not None:
        changes["warmup_steps"] = warmup_steps
    if full_update_every is not None:
        changes["full_update_every"] = full_update_every
    if not changes:
        return schedule
    return replace(schedule, phases=replace(schedule.phases, **changes))


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """Simulated step times (ms) and the signal dropped."""

    __pydantic_config__ = _CONFIG
    baseline_ms: NonNeg
    """Nothing frozen."""
    all_frozen_ms: NonNeg
    """Every freezable group frozen everywhere: the floor."""
    lp_bound_ms: NonNeg
    """A lower bound on every plan's step time under the same budget and caps: the LP
    relaxation's optimum, or, where `bound_from_lp` is false, a bound of the solve's own at or
    below it (the heuristic's past the LP's reach; the all-frozen floor for the `none`, `uniform`
    and `stability` policies). `compare`'s `timelyfreeze` policies record TimelyFreeze's own LP."""
    predicted_ms: NonNeg
    """This schedule."""
    gap: Share
    """(predicted − LP bound) / predicted."""
    signal_dropped: Share
    """Share of one step's expected progress this schedule drops."""
    progress_ratio: Share | None = None
    """Share of a step's progress the plan keeps, 1 − `signal_dropped` (absent in older files)."""
    time_to_quality: NonNeg | None = None
    """Predicted time to the same loss over not freezing's: (predicted / baseline) / progress
    ratio; below 1 is sooner (absent in older files)."""
    bound_from_lp: bool | None = None
    """Whether `lp_bound_ms` is the LP relaxation's optimum (absent in files written before
    freezeopt recorded it: unknown)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A whole schedule file."""

    __pydantic_config__ = _CONFIG
    schema_version: int
    """File format version; always first."""
    provenance: ScheduleProvenance
    pipeline: SchedulePipeline
    phases: Phases
    prediction: Prediction
    frozen: dict[int, dict[str, str | int]]
    """Per stage, per group: the microbatches in which it is frozen (`0-2,5`)."""
    ratios: dict[int, dict[str, dict[int, Share]]] = field(default_factory=dict)
    """`lp` mode only: per stage, group and microbatch, a fraction (0, 1) of the group's weight-gradient work to
    skip (whole-group freezes are listed under `frozen`)."""
    realisation: Realisation = field(default_factory=Realisation)
    """How the runtime realises the plan (defaults: whole groups, rescaled)."""
    progression: Progression | None = None
    """Freezing that grows over training (a frozen prefix, `Progression`); absent: the plan
    above is all there is."""


_ADAPTER: TypeAdapter[Schedule] = TypeAdapter(Schedule)


def format_microbatches(mbs: list[int] | set[int] | tuple[int, ...]) -> str:
    """[0, 1, 2, 5] → `0-2,5`."""
    xs = sorted(set(mbs))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        parts.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def microbatch_ranges(text: str | int, n_microbatches: int) -> tuple[tuple[int, int], ...]:
    """`0-2,5` → ((0, 2), (5, 5)), sorted; raise ValueError for malformed, out-of-range or
    repeated lists. Checked without expanding the ranges: the work is per part, not per
    microbatch (a 21 KB file of `0-1048575` ranges would otherwise take minutes)."""
    spans: list[tuple[int, int]] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty entry in microbatch list {text!r}")
        lo_s, sep, hi_s = part.partition("-")
        if not lo_s.strip().isdigit() or (sep and not hi_s.strip().isdigit()):
            raise ValueError(f"{part!r} is not a microbatch or range like 3 or 0-2")
        lo, hi = int(lo_s), int(hi_s) if sep else int(lo_s)
        if lo > hi:
            raise ValueError(f"{part!r} runs backwards; write it low-high ({hi}-{lo})")
        if hi >= n_microbatches:
            raise ValueError(f"{part!r} is outside microbatches 0..{n_microbatches - 1}")
        spans.append((lo, hi))
    spans.sort()
    if any(b_lo <= a_hi for (_, a_hi), (b_lo, _) in itertools.pairwise(spans)):
        raise ValueError(f"microbatch list {text!r} repeats a microbatch")
    return tuple(spans)


def parse_microbatches(text: str | int, n_microbatches: int) -> tuple[int, ...]:
    """`0-2,5` → (0, 1, 2, 5); raise ValueError for malformed, out-of-range or repeated lists."""
    return tuple(m for lo, hi in microbatch_ranges(text, n_microbatches) for m in range(lo, hi + 1))


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 4) if abs(x) < 1 else float(f"{x:.6g}")
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_round(v) for v in x]
    return x


class _Dumper(yaml.SafeDumper):
    pass


def _flow_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(not isinstance(v, dict | list) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _flow_dict(dumper: yaml.SafeDumper, data: dict[Any, Any]) -> yaml.Node:
    flow = bool(data) and all(isinstance(k, int) and isinstance(v, float) for k, v in data.items())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


_Dumper.add_representer(list, _flow_list)
_Dumper.add_representer(dict, _flow_dict)


def dump_schedule(schedule: Schedule) -> str:
    """Deterministic YAML text of a schedule."""
    data = _round(asdict(schedule))
    if not data["ratios"]:
        del data["ratios"]
    if data["prediction"]["bound_from_lp"] is None:  # an older file read back: left unsaid
        del data["prediction"]["bound_from_lp"]
    if data["pipeline"]["fingerprints"] is None:  # solved from a profile without them
        del data["pipeline"]["fingerprints"]
    for key in ("progress_ratio", "time_to_quality"):
        if data["prediction"][key] is None:  # an older file read back
            del data["prediction"][key]
    if data["progression"] is None:
        del data["progression"]
    if data["provenance"]["objective"] == "step":  # the default, left unsaid
        del data["provenance"]["objective"]
        del data["provenance"]["budget_cap"]
    header = (
        "# freezeopt schedule: which parameter groups to freeze in which microbatches.\n"
        "# Made by `freezeopt solve`; check it with `freezeopt validate`. Format: docs/schedule.md\n"
    )
    return header + yaml.dump(
        data,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        width=100,
        allow_unicode=False,
    )


def save_schedule(schedule: Schedule, path: str | Path) -> None:
    """Write a schedule atomically."""
    atomic_write_text(Path(path), dump_schedule(schedule))


def load_schedule(path: str | Path) -> Schedule:
    """Read and validate a schedule file (safe YAML: no tags, no code)."""
    p = Path(path)
    data = load_yaml_file(
        p,
        what="schedule",
        limit=SCHEDULE_MAX_BYTES,
        missing_hint=f"make one with `freezeopt solve PROFILE -o {p}`",
    )
    return parse_schedule(data, source=str(p))


def parse_schedule(data: Any, *, source: str = "schedule") -> Schedule:
    """Validate decoded YAML as a schedule, including its microbatch lists."""
    if not isinstance(data, dict):
        raise InputError(
            f"{source}: not a freezeopt schedule (expected a mapping with schema_version first)"
        )
    if {"actions", "ranks"} <= data.keys() and "frozen" not in data:
        raise InputError(
            f"{source} is a profile, not a schedule; make a schedule from it with "
            f"`freezeopt solve {source} -o SCHEDULE.yaml`"
        )
    if data.get("schema_version") is None:
        raise InputError(
            f"{source}: not a freezeopt schedule (no schema_version; `freezeopt solve` writes one)"
        )
    version = data.get("schema_version")
    if type(version) is not int or version != SCHEDULE_VERSION:  # `true` is no version 1
        raise InputError(
            f"{source}: schedule schema_version {data.get('schema_version')!r} is not supported; this freezeopt "
            f"reads version {SCHEDULE_VERSION} (re-run `freezeopt solve`)"
        )
    try:
        sched = _ADAPTER.validate_python(data)
    except ValidationError as e:
        fields = "`freezeopt schema schedule` and docs/schedule.md"
        raise invalid_file(source, "schedule", e, fields=fields) from None
    most = f"{MAX_STEP_MS:.0e}".replace("e+", "e")
    for name in ("baseline_ms", "all_frozen_ms", "lp_bound_ms", "predicted_ms"):
        if (v := getattr(sched.prediction, name)) > MAX_STEP_MS:  # the runtime scales them
            raise InputError(
                f"{source}: invalid schedule at prediction.{name}: {v:g} ms is over the {most} "
                "ms a step may take (what `freezeopt solve` writes is below it); re-solve the profile"
            )
    pipe = sched.pipeline
    if len(pipe.stage_to_rank) != pipe.n_stages or len(pipe.groups) != pipe.n_stages:
        raise InputError(
            f"{source}: pipeline lists {len(pipe.stage_to_rank)} ranks and {len(pipe.groups)} group lists for {pipe.n_stages} stages"
        )
    if pipe.fingerprints is not None:
        if len(pipe.fingerprints) != pipe.n_stages:
            raise InputError(
                f"{source}: pipeline.fingerprints lists {len(pipe.fingerprints)} stages for "
                f"{pipe.n_stages}; give one list per stage (or leave fingerprints out)"
            )
        for s, (stage_groups, fps) in enumerate(zip(pipe.groups, pipe.fingerprints, strict=True)):
            if len(fps) != len(stage_groups):
                raise InputError(
                    f"{source}: pipeline.fingerprints has {len(fps)} for stage {s}'s "
                    f"{len(stage_groups)} groups; give one per group (or leave fingerprints out)"
                )
    off = [r for r in pipe.stage_to_rank if r >= pipe.world_size]
    if off:
        raise InputError(
            f"{source}: pipeline.stage_to_rank names rank {off[0]}, but world_size is "
            f"{pipe.world_size} (ranks 0..{pipe.world_size - 1})"
        )
    for section, stages in (("frozen", set(sched.frozen)), ("ratios", set(sched.ratios))):
        for s in sorted(stages):
            if not 0 <= s < pipe.n_stages:
                raise InputError(
                    f"{source}: {section} names stage {s}, but the pipeline has stages 0..{pipe.n_stages - 1}"
                )
            names = (
                set(sched.frozen.get(s, {}))
                if section == "frozen"
                else set(sched.ratios.get(s, {}))
            )
            for name in sorted(names - set(pipe.groups[s])):
                raise InputError(
                    f"{source}: {section}: stage {s} has no group {name!r} (groups: {', '.join(pipe.groups[s])})"
                )
    for s, groups in sched.frozen.items():
        for name, mbs in groups.items():
            try:
                microbatch_ranges(mbs, pipe.n_microbatches)
            except ValueError as e:
                raise InputError(f"{source}: frozen: stage {s} group {name!r}: {e}") from None
    for s, ratio_groups in sched.ratios.items():
        for name, per_mb in ratio_groups.items():
            bad = [m for m in per_mb if not 0 <= m < pipe.n_microbatches]
            if bad:
                raise InputError(
                    f"{source}: ratios: stage {s} group {name!r}: microbatch {bad[0]} is out of range"
                )
    return sched


@dataclass(frozen=True, slots=True, kw_only=True)
class PipelineShape:
    """What a schedule must match to fit a pipeline: a profile's (`of_profile`) or a job's, as
    `freezeopt train` builds it from torch's schedule classes and the model on the meta device."""

    schedule: str
    world_size: int
    n_stages: int
    n_microbatches: int
    stage_to_rank: tuple[int, ...]
    groups: tuple[tuple[str, ...], ...] | None
    """Per stage, its groups' names (None: not known, not compared)."""
    fingerprints: tuple[tuple[str, ...], ...] | None = None
    """Per stage, its groups' fingerprints (None: not known for every group, not compared)."""

    @classmethod
    def of_profile(cls, profile: Profile) -> PipelineShape:
        pp = profile.pipeline
        return cls(
            schedule=pp.schedule,
            world_size=pp.world_size,
            n_stages=pp.n_stages,
            n_microbatches=pp.n_microbatches,
            stage_to_rank=tuple(st.rank for st in profile.stages),
            groups=tuple(tuple(g.name for g in st.groups) for st in profile.stages),
            fingerprints=profile_fingerprints(profile),
        )


def profile_fingerprints(profile: Profile) -> tuple[tuple[str, ...], ...] | None:
    """Per stage, the fingerprints of its groups, or None when some group has none (what a
    schedule solved from `profile` records)."""
    out: list[tuple[str, ...]] = []
    for st in profile.stages:
        row = tuple(g.fingerprint for g in st.groups if g.fingerprint is not None)
        if len(row) != len(st.groups):
            return None
        out.append(row)
    return tuple(out)


def pipeline_difference(schedule: Schedule, other: PipelineShape) -> tuple[str, Any, Any] | None:
    """The first way `other` differs from the pipeline `schedule` was made for, as (what, value in
    the schedule, value in `other`), or None when they are the same pipeline. The one fit check:
    validate, simulate, train and re-plans all ask it. Fingerprints are compared where both sides
    have them (and the group lists agree): a group's differs when it holds other parameters."""
    sp = schedule.pipeline
    want: dict[str, tuple[Any, Any]] = {
        "schedule": (sp.schedule, other.schedule),
        "ranks": (sp.world_size, other.world_size),
        "stages": (sp.n_stages, other.n_stages),
        "microbatches": (sp.n_microbatches, other.n_microbatches),
        "stage-to-rank map": (list(sp.stage_to_rank), list(other.stage_to_rank)),
    }
    if other.groups is not None:
        pairs = zip(sp.groups, other.groups, strict=False)
        want.update(
            {f"stage {s}'s group list": (list(a), list(b)) for s, (a, b) in enumerate(pairs)}
        )
        if sp.fingerprints is not None and other.fingerprints is not None:
            want.update(
                {
                    f"the fingerprint (element count-hash of shapes and dtypes) of stage {s}'s "
                    f"group {name}": (a, b)
                    for s, (names, fa, fb) in enumerate(
                        zip(sp.groups, sp.fingerprints, other.fingerprints, strict=False)
                    )
                    for name, a, b in zip(names, fa, fb, strict=False)
                }
            )
    return next(((what, a, b) for what, (a, b) in want.items() if a != b), None)


def check_fits(
    schedule: Schedule, profile: Profile, *, profile_sha256: str | None = None
) -> list[str]:
    """Raise MismatchError if the schedule is for another pipeline; return warnings (e.g. another profile)."""
    diff = pipeline_difference(schedule, PipelineShape.of_profile(profile))
    if diff is not None:
        what, a, b = diff
        raise MismatchError(
            f"the schedule does not fit this job: {what} is {short(a)} in the schedule but {short(b)} in the "
            f"profile; re-solve with `freezeopt solve` on this job's profile"
        )
    warnings = []
    if profile_sha256 is not None and profile_sha256 != schedule.provenance.profile_sha256:
        warnings.append(
            "the schedule was solved from a different profile of this pipeline; its prediction may be stale"
        )
    return warnings


def schedule_sha256(text: str) -> str:
    """Content hash of a schedule file's text."""
    return hashlib.sha256(text.encode()).hexdigest()


def schedule_json_schema() -> dict[str, Any]:
    """JSON Schema of schedule files (draft-07, usable by yaml-language-server)."""
    schema = _ADAPTER.json_schema()
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    schema["title"] = "freezeopt schedule, version 1"
    return schema
