"""The job spec: which training job `freezeopt profile` runs, and the contract for your own model.

A job spec is a small YAML file (the built-in one is `freezeopt/examples/tiny-gpt.yaml`, also
shipped as `examples/tiny-gpt.yaml`). It names the model and data, the pipeline schedule and its
shape, the optimizer and the measurement lengths. It is validated on load against the `Job`
dataclass below (pydantic at the file boundary; unknown keys are rejected); every error is one
line that says how to fix it. `docs/profiling.md` documents every field with examples.

Your own model plugs in as `model: package.module:function`. The function is called on every
rank with keyword arguments `n_stages`, `seq_len` and everything under `model_args`, after
`torch.manual_seed(seed)`, so every rank builds the same weights; it returns `ModelParts`: the
stage modules in pipeline order, the loss function applied to the last stage's output, and
optionally the parameter groups of each stage. Data plugs in the same way (`data:
package.module:function`, called with `batch_size`, `seq_len`, `seed` and `data_args`) and
returns `DataParts`. Parameter groups, the unit freezeopt freezes, are chosen in this order:
the job's `groups` (name → parameter-name patterns, applied to every stage), else the groups
the model function returns, else one group per top-level child module of each stage that holds
parameters (parameters registered directly on the stage module form a group called `params`).

A Hugging Face causal LM plugs in without code: `model: hf:<source>` (an architecture name for
random init, a `config.json`, a safetensors folder, a `.gguf` file or `pkg:<package>/<path>`;
relative paths are relative to the job file) with `model_args` for the split, groups and tied
embeddings, and `data: hf-text` for a tokenized local text corpus (`freezeopt.hf`, the optional
`freezeopt[hf]` extra; `docs/profiling.md`, "Hugging Face models").
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError

from freezeopt.errors import InputError
from freezeopt.fileio import invalid_file, load_yaml_file, non_finite

if TYPE_CHECKING:
    import torch

__all__ = [
    "BUILTIN_DATA",
    "BUILTIN_MODELS",
    "DataParts",
    "Job",
    "ModelParts",
    "add_search_path",
    "job_sha256",
    "load_job",
    "open_job",
    "parse_job",
    "replace_job",
    "resolve_data",
    "resolve_groups",
    "resolve_model",
]

BUILTIN_MODELS: Mapping[str, str] = {"tiny-gpt": "freezeopt.examples.tiny_gpt:build_model"}
"""Built-in model names and the function each stands for."""
BUILTIN_DATA: Mapping[str, str] = {
    "stdlib-bytes": "freezeopt.examples.tiny_gpt:stdlib_bytes",
    "hf-text": "freezeopt.hf.data:text_corpus",
}
"""Built-in data names and the function each stands for."""
HF_PREFIX = "hf:"
"""`model: hf:<source>`: a Hugging Face causal LM built by `freezeopt.hf.model.build_model`."""

_CALLABLE_RE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
)
_CONFIG = ConfigDict(
    extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True, strict=False
)
Pos = Annotated[int, Field(ge=1)]
MAX_SEED = 2**32 - 1
"""Largest seed: the built-in data seeds torch's generator with seed × 1,000,003 + step, which
must stay within 64 bits (a larger seed failed in every rank after the spawn)."""
MAX_TIMEOUT_S = 1e9
"""Largest `hang_timeout_s` and `timeout_s` (about 31 years): torch's process-group timeout is at
most twice the hang timeout (or the 120 s startup grace), and Python's timedelta ends at about
8.6e13 s."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """One profiling job (see the module docstring and `docs/profiling.md`)."""

    __pydantic_config__ = _CONFIG
    name: Annotated[
        str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    ]
    """Job name; the default profile file is `profiles/<name>.json`."""
    model: str = "tiny-gpt"
    """`tiny-gpt`, `hf:<source>` (a Hugging Face causal LM) or `package.module:function` returning
    `freezeopt.torchpp.job.ModelParts`."""
    model_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the model function (model size knobs, e.g. `d_model`, `n_layers`)."""
    data: str = "stdlib-bytes"
    """`stdlib-bytes`, `hf-text` (tokenized local text files) or `package.module:function`
    returning `freezeopt.torchpp.job.DataParts`."""
    data_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the data function."""
    init: Annotated[str, Field(min_length=1)] | None = None
    """Start from the weights of a run `freezeopt train` wrote instead of the model function's
    initialisation (fine-tuning): its run folder (`--out-dir`; its newest intact checkpoint) or
    one checkpoint folder in it. `~` is expanded; a relative path is relative to the job file."""
    schedule: Annotated[str, Field(min_length=1)] = "1F1B"
    """torch schedule name (GPipe, 1F1B, Interleaved1F1B, LoopedBFS, InterleavedZeroBubble,
    ZBVZeroBubble, DualPipeV) or a CSV file of per-rank compute actions (relative to the job file)."""
    ranks: Pos = 2
    """Pipeline ranks (processes)."""
    stages_per_rank: Pos | None = None
    """Stages (model chunks) per rank; default 1 for GPipe/1F1B, 2 for multi-stage schedules, and
    what the CSV holds for a CSV schedule."""
    microbatches: Pos = 8
    """Microbatches per optimizer step."""
    batch_size: Pos = 16
    """Samples per optimizer step; must be a multiple of `microbatches`."""
    seq_len: Pos = 128
    """Tokens per sample."""
    optimizer: Literal["adamw"] = "adamw"
    """Optimizer (AdamW)."""
    lr: Annotated[float, Field(gt=0)] = 1e-3
    """Learning rate."""
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    """AdamW weight decay."""
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] = 0
    """Seed for weights and data order (0 to 2^32 − 1)."""
    warmup_steps: Pos = 2
    """Optimizer steps run before measuring (the first includes torch's one-time setup)."""
    measure_steps: Pos = 10
    """Optimizer steps measured."""
    device: Literal["cpu", "cuda"] = "cpu"
    """`cpu` (gloo, thread-CPU timing) or `cuda` (nccl, CUDA-event timing)."""
    groups: dict[str, tuple[str, ...]] | None = None
    """Optional explicit parameter groups: group name → fnmatch patterns of stage-local parameter
    names, applied to every stage (a group matching nothing in a stage is absent there)."""
    cost_samples: Pos = 20
    """Measurement rounds for each parameter group's weight-gradient cost (median is kept)."""
    lag_samples: Pos = 30
    """Round trips for the point-to-point ping-pong measurement."""
    val_batches: Annotated[int, Field(ge=0)] = 4
    """Held-out batches for the validation loss (0 skips it)."""
    gradient_traces: bool = True
    """Record per-microbatch gradient norms (holds each microbatch's gradient until the step ends)."""
    probe_batches: Annotated[int, Field(ge=0, le=64)] = 2
    """Held-out batches (those after the validation batches) whose loss measures what freezing
    costs: each group's share of its change in every measured step, and the branch runs. 0 skips
    the measurement (so does `gradient_traces: false`)."""
    branch_steps: Annotated[int, Field(ge=0, le=10_000)] = 20
    """Optimizer steps of each of the two branch runs after the measured steps (full updates,
    and every group frozen in a quarter of the microbatches), which calibrate what partial
    freezing costs; 0 skips them."""
    hang_timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)] = 120.0
    """A rank that makes no progress for this long is declared hung and every rank is stopped."""
    timeout_s: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S)] = 1800.0
    """Upper bound on the whole profiling run."""

    @property
    def is_csv(self) -> bool:
        """True when `schedule` is a CSV file."""
        return self.schedule.lower().endswith(".csv")

    @property
    def microbatch_size(self) -> int:
        """Samples per microbatch."""
        return self.batch_size // self.microbatches

    def to_dict(self) -> dict[str, Any]:
        """The job as plain data (for provenance)."""
        d = asdict(self)
        if d["groups"] is not None:
            d["groups"] = {k: list(v) for k, v in d["groups"].items()}
        return d


@dataclass(frozen=True, slots=True)
class ModelParts:
    """What a model function returns."""

    stages: Sequence[torch.nn.Module]
    """The `n_stages` stage modules in pipeline order (stage i feeds stage i+1)."""
    loss_fn: Callable[[Any, Any], torch.Tensor]
    """`loss_fn(last_stage_output, target)`: the mean loss of one microbatch."""
    groups: Sequence[Mapping[str, Sequence[str]]] | None = None
    """Optional: per stage, group name → stage-local parameter names, in model order."""
    tied: Sequence[Sequence[tuple[int, str]]] = ()
    """Optional: sets of (stage, stage-local parameter name) that are copies of one shared weight
    (e.g. the input embedding on the first stage and the LM head on the last). The copies must
    start equal; before every optimizer step their gradients are summed across the stages and
    ranks that hold them, so they receive identical updates and stay equal."""


@dataclass(frozen=True, slots=True)
class DataParts:
    """What a data function returns."""

    train: Callable[[int], tuple[Any, Any]]
    """`train(step)` → (inputs, targets) of one optimizer step, `batch_size` samples along dim 0."""
    val: Callable[[int], tuple[Any, Any]]
    """`val(i)` → (inputs, targets) of the i-th held-out batch (never seen in training)."""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    """Where the data came from (versions, hashes), recorded in the profile."""


_ADAPTER: TypeAdapter[Job] = TypeAdapter(Job)


def parse_job(data: Any, *, source: str = "job", base_dir: Path | None = None) -> Job:
    """Validate decoded YAML as a job spec; raise InputError with one clear line."""
    if not isinstance(data, dict):
        raise InputError(
            f"{source}: a job spec is a YAML mapping (e.g. `name: my-job`), not {type(data).__name__}"
        )
    try:
        job = _ADAPTER.validate_python(data)
    except ValidationError as e:
        raise invalid_file(source, "job spec", e, fields="docs/profiling.md") from None
    if job.is_csv and base_dir is not None and not Path(job.schedule).is_absolute():
        job = replace(job, schedule=str((base_dir / job.schedule).resolve()))
    if base_dir is not None:
        job = _hf_paths_from(job, base_dir)
    if job.init is not None:
        init = Path(job.init).expanduser()
        if base_dir is not None and not init.is_absolute():
            init = base_dir / init
        job = replace(job, init=str(init))
    _check(job, source)
    return job


def load_job(path_or_name: str | Path) -> Job:
    """Read a job spec file, or a built-in job by name (e.g. `tiny-gpt`)."""
    from freezeopt.examples import builtin_job_path

    p = Path(path_or_name)
    if (
        not p.exists()
        and isinstance(path_or_name, str)
        and (b := builtin_job_path(path_or_name)) is not None
    ):
        p = b
    data = load_yaml_file(
        p,
        what="job spec",
        limit=1 * 2**20,
        missing_hint="pass a YAML file or the built-in job `tiny-gpt`",
        empty_hint="a job spec is a YAML mapping (e.g. `name: my-job`; docs/profiling.md lists the fields)",
    )
    return parse_job(data, source=str(p), base_dir=p.resolve().parent)


def replace_job(job: Job, **changes: Any) -> Job:
    """A copy of `job` with `changes` applied, validated like a file."""
    data = job.to_dict()
    unknown = sorted(set(changes) - set(data))
    if unknown:
        raise InputError(
            f"unknown job field(s) {', '.join(unknown)}; see docs/profiling.md for the fields"
        )
    data.update(changes)
    return parse_job(data, source=f"job {job.name}")


def job_sha256(job: Job) -> str:
    """Content hash of a job spec: sha256 of its canonical JSON."""
    return hashlib.sha256(json.dumps(job.to_dict(), sort_keys=True).encode()).hexdigest()


def _check(job: Job, source: str) -> None:
    from freezeopt.torchpp.adapter import SCHEDULE_NAMES

    if not job.is_csv and job.schedule not in SCHEDULE_NAMES:
        raise InputError(
            f"{source}: unknown schedule {job.schedule!r}; use one of {', '.join(SCHEDULE_NAMES)} or a .csv file"
        )
    if job.batch_size % job.microbatches:
        raise InputError(
            f"{source}: batch_size {job.batch_size} is not a multiple of microbatches {job.microbatches}; "
            f"use e.g. batch_size {job.microbatches * max(1, job.batch_size // job.microbatches)}"
        )
    for key, value, builtins in (
        ("model", job.model, BUILTIN_MODELS),
        ("data", job.data, BUILTIN_DATA),
    ):
        if key == "model" and value.startswith(HF_PREFIX):
            if value == HF_PREFIX:
                raise InputError(
                    f"{source}: model hf: names no source; write hf:<llama|qwen2|gpt2>, "
                    "hf:<config.json>, hf:<folder> or hf:<file.gguf>"
                )
            continue
        if value not in builtins and not _CALLABLE_RE.match(value):
            raise InputError(
                f"{source}: {key} {value!r} is neither a built-in ({', '.join(builtins)}){' nor hf:<source>' if key == 'model' else ''} nor `package.module:function`"
            )
    for key, args in (("model_args", job.model_args), ("data_args", job.data_args)):
        found = non_finite(args, key)
        if found is not None:  # passed on to user code and recorded in the profile: refused here
            raise InputError(
                f"{source}: invalid job spec at {found[0]}: {found[1]} is not a finite number "
                "(the profile records the arguments, and holds finite numbers only)"
            )
    if job.groups is not None:
        if not job.groups:
            raise InputError(f"{source}: groups is empty; drop it to use the default groups")
        for name, pats in job.groups.items():
            if not name or not pats:
                raise InputError(
                    f"{source}: group {name!r} needs a name and at least one parameter-name pattern"
                )


def _import_callable(spec: str, what: str) -> Callable[..., Any]:
    mod_name, _, fn_name = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise InputError(
            f"{what} {spec!r}: cannot import module {mod_name} ({e}); put it on PYTHONPATH or next to the job file"
        ) from None
    fn = getattr(mod, fn_name, None)
    if fn is None or not callable(fn):
        raise InputError(
            f"{what} {spec!r}: module {mod_name} has no function {fn_name}; check the name after ':'"
        )
    return fn


def add_search_path(job_file: Path | None) -> None:
    """Make modules next to the job file (and in the working directory) importable."""
    for d in (Path.cwd(), job_file.resolve().parent if job_file else None):
        if d is not None and str(d) not in sys.path:
            sys.path.append(str(d))


def open_job(job_path_or_spec: str | Path | Job, overrides: Mapping[str, Any] | None = None) -> Job:
    """A job from a YAML file, a built-in name or a `Job`, with `overrides` applied, and the job
    file's folder made importable for its `module:function` references."""
    job_file: Path | None = None
    if isinstance(job_path_or_spec, Job):
        job = job_path_or_spec
    else:
        job = load_job(job_path_or_spec)
        p = Path(job_path_or_spec)
        job_file = p if p.exists() else None
    if overrides:
        job = replace_job(job, **overrides)
    add_search_path(job_file)
    return job


def _relative_here(path: str, base_dir: Path) -> bool:
    """True for a relative path (not `pkg:`) that exists under `base_dir`."""
    return (
        not path.startswith("pkg:") and not Path(path).is_absolute() and (base_dir / path).exists()
    )


def _hf_paths_from(job: Job, base_dir: Path) -> Job:
    """`job` with the relative paths of an `hf:` model and of `hf-text` data made absolute
    against the job file's folder (where they exist there), as a CSV schedule's is."""
    changes: dict[str, Any] = {}
    src = job.model[len(HF_PREFIX) :] if job.model.startswith(HF_PREFIX) else ""
    if src and _relative_here(src, base_dir):
        changes["model"] = HF_PREFIX + str((base_dir / src).resolve())
    if job.data == "hf-text":
        args = dict(job.data_args)
        for key in ("root", "tokenizer"):
            v = args.get(key)
            if isinstance(v, str) and v and _relative_here(v, base_dir):
                args[key] = str((base_dir / v).resolve())
        if args != job.data_args:
            changes["data_args"] = args
    return replace(job, **changes) if changes else job


def resolve_model(job: Job) -> Callable[..., ModelParts]:
    """The model function of `job` (for `hf:<source>`, `freezeopt.hf.model.build_model` bound to
    the source)."""
    if job.model.startswith(HF_PREFIX):
        import functools

        build = _import_callable("freezeopt.hf.model:build_model", "model")
        return functools.partial(build, source=job.model[len(HF_PREFIX) :])
    return _import_callable(BUILTIN_MODELS.get(job.model, job.model), "model")


def resolve_data(job: Job) -> Callable[..., DataParts]:
    """The data function of `job` (`hf-text` with an `hf:` model tokenizes with that model's
    tokenizer unless `data_args.tokenizer` names another)."""
    fn = _import_callable(BUILTIN_DATA.get(job.data, job.data), "data")
    if job.data == "hf-text" and "tokenizer" not in job.data_args:
        import functools

        model = job.model[len(HF_PREFIX) :] if job.model.startswith(HF_PREFIX) else None
        return functools.partial(fn, tokenizer=model, tokenizer_of_model=True)
    return fn


def resolve_groups(
    job: Job,
    stage: int,
    param_names: Sequence[str],
    model_groups: Mapping[str, Sequence[str]] | None,
    child_of: Mapping[str, str],
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The parameter groups of one stage: ((group name, parameter names), ...) in model order.

    `param_names` are the stage's trainable parameter names in module order; `child_of` maps
    each to its top-level child module name (or '' for parameters of the stage module itself).
    Every trainable parameter must land in exactly one group.
    """
    names = list(param_names)
    out: list[tuple[str, tuple[str, ...]]] = []
    if job.groups is not None:
        owner: dict[str, str] = {}
        for g, pats in job.groups.items():
            members = tuple(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in pats))
            for n in members:
                if n in owner:
                    raise InputError(
                        f"stage {stage}: parameter {n} matches groups {owner[n]!r} and {g!r}; make the patterns disjoint"
                    )
                owner[n] = g
            if members:
                out.append((g, members))
        missing = [n for n in names if n not in owner]
        if missing:
            raise InputError(
                f"stage {stage}: parameter {missing[0]} matches no group pattern; add a pattern for it "
                f"(e.g. '{missing[0].split('.')[0]}.*') to `groups`"
            )
        order = {n: i for i, n in enumerate(names)}
        out.sort(key=lambda gm: order[gm[1][0]])
        return tuple(out)
    if model_groups is not None:
        seen: dict[str, str] = {}
        for g, group_members in model_groups.items():
            for n in group_members:
                if n not in names:
                    raise InputError(
                        f"stage {stage}: the model's group {g!r} names parameter {n!r}, which the stage does not have "
                        "(use names from the stage module's named_parameters())"
                    )
                if n in seen:
                    raise InputError(
                        f"stage {stage}: parameter {n} is in groups {seen[n]!r} and {g!r}"
                    )
                seen[n] = g
            if group_members:
                out.append((g, tuple(group_members)))
        missing = [n for n in names if n not in seen]
        if missing:
            raise InputError(
                f"stage {stage}: the model's groups leave parameter {missing[0]} out; every parameter needs a group"
            )
        return tuple(out)
    by_child: dict[str, list[str]] = {}
    for n in names:
        by_child.setdefault(child_of[n] or "params", []).append(n)
    return tuple((g, tuple(ms)) for g, ms in by_child.items())
