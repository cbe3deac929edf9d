"""The process's edge: `freezeopt`'s console-script entry point around the CLI's `app`.

Why a module of its own: what happens here concerns the process, not any command — the
collector's thresholds, the run's temp folder and its handling of SIGTERM and SIGHUP
(`freezeopt.procs.run_scope`), a usage error or an unwritable stdout turned into one line and an
exit code, `--mlflow`'s optional value. `freezeopt.cli` declares the commands.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import signal
import sys

import typer

from freezeopt.cli import DEFAULT_STORE, FLAGS, INTERRUPTED, app, one_line
from freezeopt.errors import FreezeoptError

__all__ = ["GC_THRESHOLD", "main", "optional_values"]

GC_THRESHOLD = (100_000, 50, 100)
"""The collector's thresholds for a command's process (Python's default: 700, 10, 10). A command
loads a profile and builds its DAG, millions of objects that live to the end and hold no cycles
to free, and the default collector walked them again and again: `freezeopt solve --mode heuristic
--time-limit 2` on a ZBV 64×256 profile took 5.5 s end to end with the default, 5.0 s with these
(medians of five; in-process, loading 0.38 → 0.27 s, the DAG 1.39 → 1.10 s)."""


_OUTPUT_ERRORS = {errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG}
"""Errors of writing stdout that are the user's to fix, not freezeopt's."""


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: the process's edge, so where its collector thresholds are set
    (`freezeopt.solver.modes.solve` also pauses the collector while it runs) and where a usage error
    (a missing option, a value of the wrong type) becomes one line, as every other user error
    does, rather than click's usage block; and where the run's temp folder and its handling of
    SIGTERM and SIGHUP begin and end (`freezeopt.procs.run_scope`: children killed, files removed,
    exit 128 + N with one line, as for Ctrl-C)."""
    gc.set_threshold(*GC_THRESHOLD)
    from freezeopt.procs import run_scope

    with run_scope(_stopped_line):  # the run's temp folder; SIGTERM and SIGHUP stop it in order
        _main(argv)


def _stopped_line(signum: int) -> str:
    """What a run ended by a stop signal prints, where nothing else could say it (`run_scope`)."""
    return (
        INTERRUPTED
        if signum == signal.SIGINT
        else f"error: stopped by {signal.Signals(signum).name}"
    )


def optional_values(argv: list[str]) -> list[str]:
    """`--mlflow` takes an optional value (click's own optional values do not survive typer): a
    bare `--mlflow` — last, or before another option — stands for the default store."""
    out: list[str] = []
    for i, a in enumerate(argv):
        out.append(a)
        if a == "--mlflow" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            out.append(DEFAULT_STORE)
    return out


def _main(argv: list[str] | None) -> None:
    args = optional_values(sys.argv[1:] if argv is None else list(argv))
    try:
        code = app(args=args, prog_name="freezeopt", standalone_mode=False)
        sys.stdout.flush()
    except OSError as e:
        if e.errno not in _OUTPUT_ERRORS or e.filename is not None:
            raise
        # stdout cannot take the output (`> /dev/full`, a full quota; a closed pipe never gets
        # here: click ends those itself, silently, with exit code 1): one line, as for files
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        typer.echo(f"error: cannot write the output: {e.strerror or e}", err=True)
        sys.exit(1)
    except FreezeoptError as e:  # a stop signal outside a command's own handling (`_friendly`)
        typer.echo(f"error: {one_line(e.said(FLAGS))}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        typer.echo(INTERRUPTED, err=True)
        sys.exit(130)
    except Exception as e:
        # click's own errors (vendored by typer, so matched by shape, not by class).
        message = getattr(e, "format_message", None)
        exit_code = getattr(e, "exit_code", None)
        if message is None or not isinstance(exit_code, int):
            raise
        if type(e).__name__ == "NoArgsIsHelpError":  # `freezeopt` alone: the help
            typer.echo(message(), err=True)
        else:
            ctx = getattr(e, "ctx", None)
            see = f" (see {ctx.command_path} -h)" if ctx is not None else ""
            typer.echo(f"error: {one_line(message())}{see}", err=True)
        sys.exit(exit_code)
    except typer.Abort:
        typer.echo(INTERRUPTED, err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
