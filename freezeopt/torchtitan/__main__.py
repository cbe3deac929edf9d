"""`python -m freezeopt.torchtitan [torchtitan's flags]`: torchtitan's trainer with a freeze schedule.

Run it as torchtitan's own entry point (`torchrun --nproc_per_node N -m freezeopt.torchtitan
--job.config_file job.toml --freeze.schedule schedule.yaml`). It adds `--job.custom_config_module
freezeopt.torchtitan.config` unless the command line names a config module itself, registers the
offline `freezeopt-docs` datasets, points torchtitan at the CPU where there is no accelerator
(`freezeopt.torchtitan.cpu`), and runs torchtitan's `main` with `FreezeTrainer`. A freezeopt
user error (a schedule solved for another pipeline, say) ends the rank with one line on stderr
and freezeopt's exit code for it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from freezeopt.errors import FreezeoptError

CONFIG_MODULE = "freezeopt.torchtitan.config"


def main(trainer: Callable[[], Any] | None = None) -> None:
    """Run torchtitan's `main` with `FreezeTrainer`, or with the class `trainer()` returns (called
    once torchtitan is imported: a subclass of `FreezeTrainer` defined there, say)."""
    args = sys.argv[1:]
    named = any(
        a.split("=")[0] in ("--job.custom_config_module", "--job.custom-config-module")
        for a in args
    )
    if not named and not _toml_names_config_module(args):
        args += ["--job.custom_config_module", CONFIG_MODULE]
    sys.argv[1:] = args  # before torchtitan's config manager reads them (at its import)
    from freezeopt.torchtitan import require_torchtitan

    try:
        require_torchtitan()
        import torchtitan.train

        from freezeopt.torchtitan.cpu import use_cpu
        from freezeopt.torchtitan.data import register_docs
        from freezeopt.torchtitan.trainer import FreezeTrainer

        use_cpu()
        register_docs()
        torchtitan.train.main(trainer() if trainer is not None else FreezeTrainer)
    except FreezeoptError as e:
        print(f"freezeopt: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code) from None


def _toml_names_config_module(args: list[str]) -> bool:
    """Whether the job's TOML file (`--job.config_file`) names a config module of its own (then
    that module's `JobConfig` must hold `freezeopt.torchtitan.config.Freeze` as `freeze`)."""
    import tomllib

    for i, a in enumerate(args):
        key, _, val = a.partition("=")
        if key in ("--job.config_file", "--job.config-file"):
            path = val or (args[i + 1] if i + 1 < len(args) else "")
            try:
                with open(path, "rb") as f:
                    job = tomllib.load(f).get("job", {})
            except (OSError, tomllib.TOMLDecodeError):
                return False  # torchtitan says what is wrong with the file
            return bool(isinstance(job, dict) and job.get("custom_config_module"))
    return False


if __name__ == "__main__":
    main()
