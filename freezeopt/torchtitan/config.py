"""The `[freeze]` section of a torchtitan job.

torchtitan's config manager merges the `JobConfig` of a module named by
`--job.custom_config_module` (or `[job] custom_config_module` in the TOML file) into its own, and
every field becomes a flag (`--freeze.schedule out/schedule.yaml`). `python -m freezeopt.torchtitan`
names this module itself. With neither a schedule nor a profile the trainer is torchtitan's own. (No postponed
annotations here: torchtitan resolves these fields' types in a dataclass it makes elsewhere.)
"""

from dataclasses import dataclass, field

__all__ = ["Freeze", "JobConfig"]


@dataclass
class Freeze:
    schedule: str = ""
    """The freeze schedule (YAML, from `freezeopt solve`) to replay; empty: no freezing."""
    log_dir: str = ""
    """Where rank 0 writes the controller's events (`events.jsonl`) and a record per step
    (`metrics.jsonl`: loss, step time and the prediction, per-group gradient norms), as
    `freezeopt train` does; empty: `<dump_folder>/freezeopt`."""
    warmup_steps: int | None = None
    """Steps of full updates before freezing starts; unset: the schedule's own."""
    full_update_every: int | None = None
    """A full-update step every this many steps while freezing; unset: the schedule's own."""
    rescale: bool = True
    """Scale a group's gradient by M/(M−k) when it is frozen in k of M microbatches."""
    profile: str = ""
    """Measure the job and write a freezeopt profile (JSON) here for `freezeopt solve`; empty: no
    profiling. Not with `schedule`; the pipeline alone (data parallel degrees 1)."""
    profile_warmup_steps: int = 3
    """Steps run before the measured ones (the first includes torch's one-time setup)."""
    profile_steps: int = 12
    """Steps measured; training goes on to `training.steps` after them."""


@dataclass
class JobConfig:
    freeze: Freeze = field(default_factory=Freeze)
