"""torchtitan jobs with a freeze schedule, without a fork (the optional `freezeopt[torchtitan]` extra).

A torchtitan user keeps their job and adds a schedule: `python -m freezeopt.torchtitan` is
torchtitan's own trainer, extended through the extension points torchtitan offers (a `Trainer`
subclass and a config module) — nothing of torchtitan is copied or patched on disk.

* `config`: the `[freeze]` section torchtitan's config manager merges into its `JobConfig`
  (`--job.custom_config_module freezeopt.torchtitan.config`);
* `trainer`: `FreezeTrainer`, which replays a schedule with `FreezeController` on the stages
  torchtitan built (FSDP2-sharded ones included: `enable_freezing` is exact under FSDP2), checks
  the schedule against torchtitan's pipeline, rescales, watches drift and checkpoints the
  controller with torchtitan's checkpointer;
* `model`: the same model as a freezeopt job (`model: freezeopt.torchtitan.model:llama3`), split
  into stages as torchtitan splits it, one group per decoder layer, so `freezeopt profile` and
  `freezeopt solve` give the schedule the trainer replays;
* `data`: an offline byte-level tokenizer and the Python documentation corpus as a torchtitan
  dataset (`freezeopt-docs`), so a job runs with nothing downloaded;
* `cpu`: what torchtitan needs to run on a machine without an accelerator (it assumes CUDA).

The pair: torchtitan 0.2.2 on torch 2.13.0 (0.3.0 calls torch APIs newer than 2.13; 0.2.2 runs
unchanged once `cpu` stands in for CUDA on a CPU-only machine). docs/torchtitan.md says how.
"""

from __future__ import annotations

from types import ModuleType

from freezeopt.errors import InputError

__all__ = ["INSTALL_HINT", "TORCHTITAN_VERSION", "require_torchtitan"]

TORCHTITAN_VERSION = "0.2.2"
"""The torchtitan release this integration is built and tested against."""

INSTALL_HINT = "install freezeopt[torchtitan] (pip install 'freezeopt[torchtitan]' torch==2.13.0)"
"""The one line said when the extra is missing."""


def require_torchtitan() -> ModuleType:
    """Import torchtitan, or raise InputError saying how to install it."""
    try:
        import torchtitan
    except ImportError as e:
        raise InputError(f"torchtitan is not installed ({e}); {INSTALL_HINT}") from None
    got = getattr(torchtitan, "__version__", "")
    if got and got != TORCHTITAN_VERSION and not got.startswith("0.0.0"):
        raise InputError(
            f"torchtitan {got} is installed; freezeopt's integration is built for "
            f"{TORCHTITAN_VERSION}: {INSTALL_HINT}"
        )
    return torchtitan
