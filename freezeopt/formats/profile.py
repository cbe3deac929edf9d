"""The profile file (version 1): everything `freezeopt solve` needs, measured or synthesised.

A profile describes one pipelined training job: which actions each rank runs and in what order,
how long each takes, what each stage's parameter groups cost in weight-gradient time, the
point-to-point lags between stages, and the gradient traces that sensitivities come from. It is
JSON, written deterministically, and validated on load against the dataclasses below (pydantic at
the file boundary only; the rest of freezeopt sees plain frozen dataclasses). `docs/profile.md`
describes every field; `schema/profile.v1.json` is generated from these classes.

Times are milliseconds. `cost` of an action is its compute time (thread CPU time on CPU, CUDA
events on GPU); the weight-gradient cost of a group is the time its gradient takes inside one
backward of one microbatch, the time saved when it is frozen there.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from freezeopt.errors import InputError, short
from freezeopt.formats.fingerprint import FINGERPRINT_PATTERN

__all__ = [
    "PROFILE_VERSION",
    "ActionCost",
    "Branch",
    "GradientTrace",
    "GroupProfile",
    "Lag",
    "Pipeline",
    "Probe",
    "Profile",
    "Provenance",
    "RankProfile",
    "StageProfile",
    "Stat",
    "TimelineEntry",
    "dump_profile",
    "load_profile",
    "profile_json_schema",
    "profile_sha256",
    "save_profile",
]

PROFILE_VERSION = 1
PROFILE_MAX_BYTES = 256 * 2**20
MAX_RANKS = 2**16
"""Largest world size and stage count a file may claim (far above any real pipeline; a bound so a
mutated number cannot make a checker allocate without limit)."""
MAX_MICROBATCHES = 2**20
MAX_MS = 1e9
"""Largest time (ms, about 11.6 days) a profile's statistics (`Stat`: action, group, lag,
optimizer and step times) may hold. The solver adds them along the pipeline's paths and hands the
sums to LP solvers, which take 1e20 (HiGHS) or 1e30 (CBC) as infinite: a profile within its size
limit holds under 3.4e7 actions, so at 1e9 ms each a step stays below `MAX_STEP_MS`."""
MAX_STEP_MS = 1e18
"""Largest step time (ms) a file may hold (a schedule's predictions, a timeline's offsets): above
what a profile within `MAX_MS` and its size limit can give (3.4e7 actions and lags of 1e9 ms)."""
MAX_SQ_NORM = 1e100
"""Largest squared gradient norm a trace may hold (what float32 gradients of 1e12 parameters can
reach is below 1e90): the `gns` estimators multiply and divide them (the noise over |G|², floored
at 1e-3 of the step's norm, times microbatch sizes), and much larger ones overflow."""
MAX_LOSS = 1e12
"""Largest probe loss (or loss change) a file may hold: far above any loss a run that did not
diverge reports, small enough that the shares the `measured` sensitivity divides stay finite."""
MAX_MICROBATCH_SIZE = 2**32
MAX_NUMEL = 2**53
"""Largest group size: the sensitivity estimates weigh groups by it as a float (exact to 2^53)."""
_CONFIG = ConfigDict(extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True)
NonNeg = Annotated[float, Field(ge=0)]
Count = Annotated[int, Field(ge=0)]
Ms = Annotated[float, Field(ge=0, le=MAX_MS)]
StepMs = Annotated[float, Field(ge=0, le=MAX_STEP_MS)]
SqNorm = Annotated[float, Field(ge=0, le=MAX_SQ_NORM)]


@dataclass(frozen=True, slots=True, kw_only=True)
class Stat:
    """Statistics of one measured quantity over the measured steps (milliseconds)."""

    __pydantic_config__ = _CONFIG
    median: Ms
    """Median over the samples; what the solver uses."""
    p10: Ms
    """10th percentile."""
    p90: Ms
    """90th percentile."""
    n: Count
    """Number of samples."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupProfile:
    """One parameter group of a stage: the unit freezeopt freezes."""

    __pydantic_config__ = _CONFIG
    name: Annotated[str, Field(min_length=1, max_length=200)]
    """Group name, unique within its stage (e.g. `blocks.3`)."""
    params: tuple[str, ...]
    """Names of the parameters in the group."""
    numel: Annotated[int, Field(ge=0, le=MAX_NUMEL)]
    """Number of scalar parameters."""
    weight_grad_ms: Stat
    """Weight-gradient cost of this group in one backward of one microbatch: the time freezing saves."""
    fingerprint: Annotated[str, Field(pattern=FINGERPRINT_PATTERN)] | None = None
    """What the group holds, `<element count>-<16 hex digits>`: the digits are the start of the
    sha256 of its parameters' sorted `[shape, dtype]` list (`freezeopt.formats.fingerprint`).
    Schedules copy it, and `train`, `FreezeController` and `validate --profile` refuse a model or
    profile whose group differs (a model of another width). `freezeopt profile` records it;
    `freezeopt synth` leaves it out (its groups have no tensors), as do profiles written before
    freezeopt recorded it: without it only the group names are checked."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageProfile:
    """One pipeline stage (a model chunk) and its parameter groups."""

    __pydantic_config__ = _CONFIG
    stage: Count
    """Stage index, 0 is the first stage."""
    rank: Count
    """The rank that runs this stage."""
    groups: tuple[GroupProfile, ...]
    """Its parameter groups, in model order."""
    truncation_ms: tuple[Stat, ...] = ()
    """Backward truncation, where measured (stages whose backward runs whole: one `B` action, or
    stage 0's `W`): what a backward saves beyond the frozen groups' weight-gradient costs when
    autograd can stop early. Entry 0: when the stage's input gradient is not needed (every stage
    before it is frozen whole in that microbatch); entry j ≥ 1: the further time saved once group j
    is frozen too, with every group before it (model order) — the input-gradient work below the
    first trainable group. len(groups) + 1 entries."""
    all_grouped: bool | None = None
    """Whether every trainable parameter of the stage is in one of its groups: only then does a
    microbatch with all its groups frozen need no gradient from the stage after it (and that stage
    no input gradient). None where not measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionCost:
    """Measured duration of one action, e.g. `0F3`, over the measured steps."""

    __pydantic_config__ = _CONFIG
    action: Annotated[str, Field(pattern=r"^\d+[FBIW]\d+$")]
    """The action in torch's notation: stage, kind (F, B, I, W), microbatch."""
    cost_ms: Stat
    """Compute time of the action with nothing frozen."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RankProfile:
    """What one rank ran."""

    __pydantic_config__ = _CONFIG
    rank: Count
    """Rank index."""
    actions: tuple[Annotated[str, Field(pattern=r"^\d+[FBIW]\d+$")], ...]
    """Compute actions in the order the rank executed them."""
    composites: tuple[tuple[Annotated[str, Field(pattern=r"^\d+[FBIW]\d+$")], ...], ...] = ()
    """Runs of consecutive `actions` that torch executes as one unit (DualPipeV's overlapped
    forward and backward, `(aFm;bBn)OVERLAP_F_B`): each run's sends to other ranks leave only
    after its last action. Empty for schedules without composites."""
    optimizer_ms: Stat | None = None
    """Optimizer-step time on this rank, where measured."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Lag:
    """Point-to-point transfer time between two stages on different ranks."""

    __pydantic_config__ = _CONFIG
    src_stage: Count
    """Sending stage."""
    dst_stage: Count
    """Receiving stage."""
    kind: Literal["F", "B"]
    """`F`: activations (forward); `B`: input gradients (backward)."""
    ms: Stat
    """Transfer time."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GradientTrace:
    """Gradient norms of one parameter group, per measured step, for sensitivity estimates."""

    __pydantic_config__ = _CONFIG
    stage: Count
    """Stage of the group."""
    group: str
    """Group name."""
    microbatch_sq_norms: tuple[tuple[SqNorm, ...], ...]
    """Per step, per microbatch: squared L2 norm of the group's gradient of that microbatch's mean loss."""
    step_sq_norms: tuple[SqNorm, ...]
    """Per step: squared L2 norm of the group's gradient of the step's mean loss (all microbatches)."""
    effective_perturbation: tuple[NonNeg, ...] = ()
    """Per step: APF's |EMA(Δ)|/EMA(|Δ|) of the group's updates (0 = oscillating/converged, 1 = drifting)."""
    loss_change: tuple[Annotated[float, Field(ge=-MAX_LOSS, le=MAX_LOSS)], ...] = ()
    """Per step: the group's share of the change of the probe loss over that step (loss-change
    allocation, Lan et al. 2019): ½(h_t + h_t+1)·Δθ, with h the probe loss's gradient before and
    after the step and Δθ the update the optimizer applied to the group. Negative where the group
    lowered the loss. Over the groups it sums to the probe loss's own change (`Probe.loss`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Branch:
    """Two short runs from one state, the same data in both: full updates, and every group
    frozen in the same share of each step's microbatches (rescaled as training rescales). Their
    probe losses measure how much progress a freezing plan of that share really keeps."""

    __pydantic_config__ = _CONFIG
    steps: Annotated[int, Field(ge=1)]
    """Optimizer steps in each run."""
    frozen_share: Annotated[float, Field(gt=0, lt=1)]
    """Share of each step's microbatches every group was frozen in (drawn per step, the same in
    both runs' data)."""
    loss_start: Annotated[float, Field(ge=-MAX_LOSS, le=MAX_LOSS)]
    """Probe loss where both runs started."""
    loss_full: Annotated[float, Field(ge=-MAX_LOSS, le=MAX_LOSS)]
    """Probe loss after the run with full updates."""
    loss_frozen: Annotated[float, Field(ge=-MAX_LOSS, le=MAX_LOSS)]
    """Probe loss after the run with every group frozen in `frozen_share` of the microbatches."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Probe:
    """The probe loss: the mean loss on a few fixed held-out batches (never trained on), which
    measures what freezing costs (`GradientTrace.loss_change`, `Branch`)."""

    __pydantic_config__ = _CONFIG
    batches: Annotated[int, Field(ge=1)]
    """Held-out batches it averages (those after the validation batches)."""
    loss: tuple[Annotated[float, Field(ge=-MAX_LOSS, le=MAX_LOSS)], ...]
    """Before each measured step and after the last (one more than the measured steps)."""
    branch: Branch | None = None
    """The branch runs that calibrate the cost of partial freezing, where made."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimelineEntry:
    """When one action ran in a measured step (wall clock, ms from the step's start)."""

    __pydantic_config__ = _CONFIG
    action: Annotated[str, Field(pattern=r"^\d+[FBIW]\d+$")]
    """The action in torch's notation."""
    rank: Count
    """The rank that ran it."""
    start_ms: StepMs
    """Start, ms after the step started (the earliest rank's start)."""
    end_ms: StepMs
    """End, ms after the step started."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Pipeline:
    """The pipeline the profile describes."""

    __pydantic_config__ = _CONFIG
    schedule: Annotated[str, Field(min_length=1)]
    """torch schedule name (e.g. `1F1B`, `ZBVZeroBubble`) or `csv:<file name>` for a custom order."""
    world_size: Annotated[int, Field(ge=1, le=MAX_RANKS)]
    """Number of pipeline ranks."""
    n_stages: Annotated[int, Field(ge=1, le=MAX_RANKS)]
    """Number of stages (model chunks) over all ranks."""
    n_microbatches: Annotated[int, Field(ge=1, le=MAX_MICROBATCHES)]
    """Microbatches per optimizer step."""
    microbatch_size: Annotated[int, Field(ge=1, le=MAX_MICROBATCH_SIZE)] = 1
    """Samples per microbatch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Provenance:
    """Where the profile came from."""

    __pydantic_config__ = _CONFIG
    source: Literal["synth", "measured"]
    """`measured` for a real run, `synth` for `freezeopt synth`."""
    freezeopt: str
    """freezeopt version that wrote it."""
    python: str
    """Python version."""
    torch: str | None = None
    """torch version, where torch was used."""
    device: str = "none"
    """Device kind of the measurement, e.g. `cpu`, `cuda:NVIDIA H200`, or `none` for synth."""
    job: dict[str, Any] | None = None
    """The job spec (or synth options) as given."""
    job_sha256: str | None = None
    """sha256 of the canonical JSON of `job`."""
    seed: int | None = None
    """Random seed."""
    steps_measured: Count = 0
    """Optimizer steps the statistics cover."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """A whole profile file."""

    __pydantic_config__ = _CONFIG
    schema_version: Literal[1]
    """File format version; always first."""
    provenance: Provenance
    pipeline: Pipeline
    ranks: tuple[RankProfile, ...]
    """Per rank, the executed action order."""
    actions: tuple[ActionCost, ...]
    """Per action, its measured cost."""
    stages: tuple[StageProfile, ...]
    """Per stage, its rank and parameter groups."""
    lags: tuple[Lag, ...] = ()
    """Measured point-to-point lags; pairs not listed count as 0."""
    gradients: tuple[GradientTrace, ...] = ()
    """Gradient traces per group; without them only the `numel` and `flat` sensitivities can
    solve it (`gns`, `gns-raw` and `norm` need traces)."""
    loss: tuple[float, ...] = ()
    """Training loss per measured step."""
    val_loss: tuple[float, ...] = ()
    """Validation loss, where measured."""
    step_ms: Stat | None = None
    """Measured wall time of one pipeline step (first rank's start to last rank's end of the
    schedule's step; the optimizer is timed apart, `ranks[].optimizer_ms`), where measured."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form extras (e.g. the profiler's self-check); ignored by `solve`."""
    timeline: tuple[TimelineEntry, ...] = ()
    """Measured wall-clock start and end of every action in one representative step (the measured
    step with the median step time), for measured-versus-simulated Gantt charts; empty for synth."""
    probe: Probe | None = None
    """The probe loss over the measured steps and the branch runs: what the `measured`
    sensitivity is made of (None: not measured; profiles before freezeopt measured it, synth)."""

    def stage_groups(self, stage: int) -> tuple[GroupProfile, ...]:
        """The parameter groups of `stage`."""
        return self.stages[stage].groups


_ADAPTER: TypeAdapter[Profile] = TypeAdapter(Profile)


_FIELDS: dict[type, tuple[str, ...]] = {}
_ESCAPE = json.encoder.encode_basestring_ascii  # C, where the interpreter has it
_NOT_FINITE = "Out of range float values are not JSON compliant"
_LEFT_OUT = {
    "fingerprint": None,
    "composites": (),
    "loss_change": (),
    "probe": None,
    "truncation_ms": (),
    "all_grouped": None,
}
"""Dataclass fields a file leaves out when they hold these values (so a profile written before
freezeopt recorded them is written back byte for byte, and the hashes in its schedules stay valid)."""


def _kept(name: str, value: Any) -> bool:
    return name not in _LEFT_OUT or value != _LEFT_OUT[name]


def _fields(kind: type) -> tuple[str, ...] | None:
    names = _FIELDS.get(kind)
    if names is None and is_dataclass(kind):
        names = _FIELDS[kind] = tuple(f.name for f in fields(kind))
    return names


def _round(x: float, digits: int) -> float:
    return 0.0 if x == 0 else float(f"{x:.{digits}g}")


def _plain(x: Any, digits: int = 6) -> Any:
    """Dataclasses as dicts, tuples as lists, floats rounded to `digits` significant digits (so
    files diff cleanly): what `dataclasses.asdict` and rounding give, without `asdict`'s deep
    copies. The data a profile file holds; `dump_profile` writes it without building it."""
    if isinstance(x, float):
        return _round(x, digits)
    if isinstance(x, list | tuple):
        return [_plain(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v, digits) for k, v in x.items()}
    names = _fields(type(x))
    if names is not None:
        return {n: _plain(v, digits) for n in names if _kept(n, v := getattr(x, n))}
    return x


class _Unusual(Exception):
    """A value `_emit` leaves to `json` (a non-string key, an unknown type)."""


def _emit(x: Any, nl: str, out: list[str]) -> None:
    """Append the text `json.dumps(_plain(x), indent=1, ensure_ascii=True, allow_nan=False)`
    gives `x` at the indent `nl` (a newline and the indent) to `out`, in one pass. With `indent`
    `json` runs its pure-Python encoder: `_plain` then `json` took 1.0–1.2 s on a ZBV 64×256
    profile, this 0.75 s; with the fields that are floats, strings and ints written in their
    dataclass's loop and runs of floats or strings joined at once, 0.64 s (medians of seven,
    against 0.88 s side by side)."""
    if type(x) is float:  # most of a profile: gradient traces and costs
        r = _round(x, 6)
        if not math.isfinite(r):
            raise ValueError(_NOT_FINITE)
        out.append(float.__repr__(r))
    elif isinstance(x, str):
        out.append(_ESCAPE(x))
    elif isinstance(x, list | tuple):
        inner = nl + " "
        if x and all(type(v) is float for v in x):  # a run of floats (traces): no call per float
            # `_round(v, 6)` written out here and for float fields below: a call per float made
            # the ZBV 64×256 dump 15–25 % slower (0.53 → 0.61–0.66 s); the tests hold the bytes
            # to `json`'s on `_plain`'s data
            run = [0.0 if v == 0 else float(f"{v:.6g}") for v in x]
            if not all(map(math.isfinite, run)):
                raise ValueError(_NOT_FINITE)
            out.append("[" + inner + ("," + inner).join(map(float.__repr__, run)) + nl + "]")
            return
        if x and all(type(v) is str for v in x):  # a rank's actions
            out.append("[" + inner + ("," + inner).join(map(_ESCAPE, x)) + nl + "]")
            return
        sep = "[" + inner
        for v in x:
            out.append(sep)
            _emit(v, inner, out)
            sep = "," + inner
        out.append("[]" if not x else nl + "]")
    elif x is None or x is True or x is False:
        out.append("null" if x is None else "true" if x else "false")
    elif isinstance(x, int):
        out.append(int.__repr__(x))
    elif isinstance(x, float):
        _emit(float(x), nl, out)
    else:
        if isinstance(x, dict):
            items: Iterable[tuple[Any, Any]] = x.items()
        elif (names := _fields(type(x))) is not None:
            items = ((n, v) for n in names if _kept(n, v := getattr(x, n)))
        else:
            raise _Unusual
        inner = nl + " "
        sep = "{" + inner
        for k, v in items:
            if not isinstance(k, str):
                raise _Unusual
            t = type(v)  # most fields (costs, counts, names): written here, not by a call each
            if t is float:
                r = 0.0 if v == 0 else float(f"{v:.6g}")
                if not math.isfinite(r):
                    raise ValueError(_NOT_FINITE)
                out.append(sep + _ESCAPE(k) + ": " + float.__repr__(r))
            elif t is str:
                out.append(sep + _ESCAPE(k) + ": " + _ESCAPE(v))
            elif t is int:
                out.append(sep + _ESCAPE(k) + ": " + int.__repr__(v))
            else:
                out.append(sep + _ESCAPE(k) + ": ")
                _emit(v, inner, out)
            sep = "," + inner
        out.append("{}" if sep[0] == "{" else nl + "}")


def dump_profile(profile: Profile) -> str:
    """Serialise a profile to deterministic JSON text (same profile → same bytes): `_plain`'s data
    as `json.dumps` writes it with `indent=1`, made by `_emit` in one pass."""
    out: list[str] = []
    try:
        _emit(profile, "\n", out)
    except _Unusual:
        out = [json.dumps(_plain(profile), indent=1, ensure_ascii=True, allow_nan=False)]
    return "".join(out) + "\n"


def profile_sha256(profile: Profile) -> str:
    """Content hash of a profile: sha256 of its canonical JSON."""
    return hashlib.sha256(dump_profile(profile).encode()).hexdigest()


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write a profile atomically, and only one `load_profile` reads back: the text is validated
    as the loader validates it first (InputError, nothing written, where it would be refused)."""
    from freezeopt.fileio import atomic_write_text, non_finite

    source = f"profile {path} (not written)"
    try:
        text = dump_profile(profile)
    except ValueError:  # a NaN or infinity, which JSON cannot hold: say where
        where, v = non_finite(_plain(profile), "") or ("", math.nan)
        raise InputError(
            f"{source}: invalid profile at {where.lstrip('.')}: {v} is not a finite number"
        ) from None
    parse_profile(json.loads(text), source=source)
    atomic_write_text(Path(path), text)


def parse_profile(data: Any, *, source: str = "profile") -> Profile:
    """Validate already-decoded JSON data as a profile; raise InputError with one clear line."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: not a freezeopt profile (expected a JSON object)")
    version = data.get("schema_version")
    if version is None:
        raise InputError(
            f"{source}: not a freezeopt profile (no schema_version; `freezeopt profile` and "
            "`freezeopt synth` write one)"
        )
    if type(version) is not int or version != PROFILE_VERSION:  # `true` is no version 1
        raise InputError(
            f"{source}: profile schema_version {version!r} is not supported; this freezeopt reads "
            f"version {PROFILE_VERSION} (re-run `freezeopt profile` or `freezeopt synth`)"
        )
    try:
        profile = _ADAPTER.validate_python(data)
    except ValidationError as e:
        from freezeopt.fileio import invalid_file

        over = _over_limit(e)
        if over is not None:
            raise InputError(f"{source}: {over}") from None
        fields = "`freezeopt schema profile` and docs/profile.md"
        raise invalid_file(source, "profile", e, fields=fields) from None
    _check_traces(profile, source)
    problem = _number_problem(profile)
    if problem is not None:
        raise InputError(f"{source}: {problem}")
    return profile


def _check_traces(profile: Profile, source: str) -> None:
    """Gradient traces belong to the profile's groups and hold one norm per microbatch and step
    (the sensitivity estimates average them: a short row would be averaged silently); a stage's
    truncation gains number one more than its groups."""
    for st in profile.stages:
        n = len(st.truncation_ms)
        if n and n != len(st.groups) + 1:
            raise InputError(
                f"{source}: stages.{st.stage}.truncation_ms has {n} entries; the stage has "
                f"{len(st.groups)} groups, so it needs {len(st.groups) + 1} (none to all frozen)"
            )
    groups = {(st.stage, g.name) for st in profile.stages for g in st.groups}
    m = profile.pipeline.n_microbatches
    for i, t in enumerate(profile.gradients):
        at = f"{source}: gradients.{i}"
        if (t.stage, t.group) not in groups:
            raise InputError(
                f"{at} names group {t.group!r} of stage {t.stage}, which has no such group"
            )
        if len(t.microbatch_sq_norms) != len(t.step_sq_norms):
            raise InputError(
                f"{at} has {len(t.microbatch_sq_norms)} steps of microbatch norms but "
                f"{len(t.step_sq_norms)} of step norms; they must match"
            )
        short = next((r for r in t.microbatch_sq_norms if len(r) != m), None)
        if short is not None:
            raise InputError(
                f"{at} has a step with {len(short)} microbatch norms; the pipeline has {m} microbatches"
            )
        probe = profile.probe
        if t.loss_change and (probe is None or len(t.loss_change) != len(probe.loss) - 1):
            had = "no probe loss" if probe is None else f"{len(probe.loss)} probe losses"
            raise InputError(
                f"{at} has {len(t.loss_change)} steps of loss change but the profile has {had}; "
                "a step's change needs the probe loss before and after it"
            )


def _number_problem(profile: Profile) -> str | None:
    """What is wrong with a validated profile's numbers that its types cannot say, or None: a NaN
    or infinity in a free-form field (`provenance.job`, `extra`; pydantic refuses them in the
    typed ones, and values past `MAX_MS` and the other limits), or action costs that are all 0."""
    from freezeopt.fileio import non_finite

    for where, free in (("provenance.job", profile.provenance.job), ("extra", profile.extra)):
        found = non_finite(free, where)
        if found is not None:
            return (
                f"invalid profile at {found[0]}: {found[1]} is not a finite number (every "
                "number in a profile must be finite)"
            )
    if profile.actions and not any(a.cost_ms.median > 0 for a in profile.actions):
        return (
            "every action costs 0 ms: there is nothing to optimise; re-profile the job "
            "(`freezeopt profile`) or synthesise one with positive costs (`freezeopt synth`)"
        )
    return None


_LIMITS: dict[float, str] = {
    MAX_MS: "ms a profile's times may be (the solver adds them up along the pipeline's paths); "
    "check the units (milliseconds)",
    MAX_STEP_MS: "ms a step may take",
    MAX_SQ_NORM: "the sensitivity estimates can take (larger ones overflow their arithmetic); the "
    "run it came from diverged, re-profile it",
    MAX_MICROBATCH_SIZE: "samples a microbatch may hold",
    MAX_NUMEL: "parameters a group may hold (the sensitivity estimates weigh groups by it as a float)",
}
"""Why each of the limits is there, for the one line that refuses a value past it."""


def _over_limit(error: ValidationError) -> str | None:
    """pydantic's first complaint, where it is a value past one of `_LIMITS`: which and why."""
    err = error.errors()[0]
    limit = err.get("ctx", {}).get("le") if err["type"] == "less_than_equal" else None
    if limit not in _LIMITS:
        return None
    v = err["input"]
    said = f"{v:g}" if isinstance(v, float) else short(v)  # an int may have 400 digits
    where = ".".join(str(p) for p in err["loc"])
    return f"invalid profile at {where}: {said} is over the {_e(limit)} {_LIMITS[limit]}"


def _e(limit: float) -> str:
    """A limit as a message says it: 1e9, not 1e+09; 4,294,967,296 for a count."""
    if isinstance(limit, int):
        return f"{limit:,}"
    return f"{limit:.0e}".replace("e+0", "e").replace("e+", "e")


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file."""
    from freezeopt.fileio import load_json_file

    p = Path(path)
    try:
        data = load_json_file(
            p,
            what="profile",
            limit=PROFILE_MAX_BYTES,
            missing_hint="create one with `freezeopt profile` or `freezeopt synth`",
        )
    except InputError:
        if p.suffix.lower() in (".yaml", ".yml") and p.is_file():
            raise InputError(
                f"{p}: not a profile (profiles are JSON; YAML files are schedules or job specs); "
                "pass the profile (`freezeopt profile` or `freezeopt synth` makes one)"
            ) from None
        raise
    return parse_profile(data, source=str(p))


def profile_json_schema() -> dict[str, Any]:
    """JSON Schema of profile files, generated from the dataclasses."""
    schema = _ADAPTER.json_schema()
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    schema["title"] = "freezeopt profile, version 1"
    return schema
