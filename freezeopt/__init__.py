"""freezeopt: freeze the right parameters at the right time in pipeline-parallel training.

The data flow is one sub-package per step: a job runs under torch (`torchpp`) and is measured
(`profiling`) into a profile file (`formats`); the schedule becomes a DAG with its timing and
signal model (`model`); the solver decides what to freeze (`solver`) and writes a schedule file
(`formats`); training replays it (`training`); policies are compared side by side (`compare`).
`commands` holds the file-to-file steps of the CLI (`cli`); `actions`, `errors` and `fileio` are
the vocabulary, the error types and safe file I/O every package uses.

The names below are the public API, imported on first use so that `import freezeopt` stays cheap
(it loads neither torch nor the solver):

    from freezeopt import FreezeController, load_schedule, enable_freezing, scale_group_grads
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("freezeopt")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

_PUBLIC = {
    # your model and data, in a job spec (`model: pkg.module:function`)
    "ModelParts": "freezeopt.torchpp.job",
    "DataParts": "freezeopt.torchpp.job",
    "Job": "freezeopt.torchpp.job",
    "load_job": "freezeopt.torchpp.job",
    # the runtime hook, for your own training loop
    "FreezeController": "freezeopt.training.runtime",
    "enable_freezing": "freezeopt.torchpp.adapter",
    "scale_group_grads": "freezeopt.torchpp.adapter",
    # the files
    "Profile": "freezeopt.formats.profile",
    "load_profile": "freezeopt.formats.profile",
    "Schedule": "freezeopt.formats.schedule",
    "load_schedule": "freezeopt.formats.schedule",
    "save_schedule": "freezeopt.formats.schedule",
    # the steps, as library calls
    "profile_job": "freezeopt.profiling.run",
    "synth_profile": "freezeopt.profiling.synth",
    "SynthOptions": "freezeopt.profiling.synth",
    "build_dag": "freezeopt.model.dag",
    "simulate": "freezeopt.model.simulate",
    "estimate_signal": "freezeopt.model.sensitivity",
    "solve": "freezeopt.solver.modes",
    "SolveOptions": "freezeopt.solver.problem",
    "SolveResult": "freezeopt.solver.problem",
    "schedule_from_result": "freezeopt.solver.export",
    "train_job": "freezeopt.training.train",
    "TrainOptions": "freezeopt.training.options",
    "PhaseOverrides": "freezeopt.training.options",
    "CheckpointOptions": "freezeopt.training.options",
    "ReplanOptions": "freezeopt.training.options",
    "compare_job": "freezeopt.compare.run",
    "CompareOptions": "freezeopt.compare.run",
    # errors
    "FreezeoptError": "freezeopt.errors",
    "InputError": "freezeopt.errors",
    "MismatchError": "freezeopt.errors",
    "SolverError": "freezeopt.errors",
}
"""Public name → the module that defines it."""

__all__ = [
    "CheckpointOptions",
    "CompareOptions",
    "DataParts",
    "FreezeController",
    "FreezeoptError",
    "InputError",
    "Job",
    "MismatchError",
    "ModelParts",
    "PhaseOverrides",
    "Profile",
    "ReplanOptions",
    "Schedule",
    "SolveOptions",
    "SolveResult",
    "SolverError",
    "SynthOptions",
    "TrainOptions",
    "__version__",
    "build_dag",
    "compare_job",
    "enable_freezing",
    "estimate_signal",
    "load_job",
    "load_profile",
    "load_schedule",
    "profile_job",
    "save_schedule",
    "scale_group_grads",
    "schedule_from_result",
    "simulate",
    "solve",
    "synth_profile",
    "train_job",
]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'freezeopt' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from freezeopt.compare.run import CompareOptions, compare_job
    from freezeopt.errors import FreezeoptError, InputError, MismatchError, SolverError
    from freezeopt.formats.profile import Profile, load_profile
    from freezeopt.formats.schedule import Schedule, load_schedule, save_schedule
    from freezeopt.model.dag import build_dag
    from freezeopt.model.sensitivity import estimate_signal
    from freezeopt.model.simulate import simulate
    from freezeopt.profiling.run import profile_job
    from freezeopt.profiling.synth import SynthOptions, synth_profile
    from freezeopt.solver.export import schedule_from_result
    from freezeopt.solver.modes import solve
    from freezeopt.solver.problem import SolveOptions, SolveResult
    from freezeopt.torchpp.adapter import enable_freezing, scale_group_grads
    from freezeopt.torchpp.job import DataParts, Job, ModelParts, load_job
    from freezeopt.training.options import (
        CheckpointOptions,
        PhaseOverrides,
        ReplanOptions,
        TrainOptions,
    )
    from freezeopt.training.runtime import FreezeController
    from freezeopt.training.train import train_job
