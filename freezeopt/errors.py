"""The errors freezeopt raises for things a user can fix.

Every message is one line that says what is wrong and how to fix it. The CLI turns these into a
line on stderr and the exit code below, never a traceback. An option named in a message is marked
with `option("time_limit")`: a library caller reads the field's name (`time_limit`), the command
line the flag it came from (`--time-limit`, through `FreezeoptError.said` and the CLI's table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "EXIT_CODES",
    "DivergedError",
    "FreezeoptError",
    "InputError",
    "LpUnsolved",
    "MismatchError",
    "RankFailedError",
    "SolverError",
    "StoppedError",
    "TrackingError",
    "option",
    "short",
]


_FIELD = "\x00"
"""Brackets an option's field name inside a message (a byte no path, flag or number holds)."""


def option(name: str) -> str:
    """An option's name inside an error message: `name` where the library's caller reads it, the
    command-line flag where the CLI prints it (`FreezeoptError.said`)."""
    return f"{_FIELD}{name}{_FIELD}"


def short(v: Any, width: int = 60) -> str:
    """A value for a one-line message: at most `width` characters."""
    s = str(v)
    return s if len(s) <= width else s[: width - 3] + "..."


class FreezeoptError(Exception):
    """Base class: a problem the user can fix. `exit_code` is what the CLI exits with."""

    exit_code = 1

    def said(self, names: Mapping[str, str] | None = None) -> str:
        """The message, each option marked with `option` named as `names` maps it (else by its
        field name)."""
        parts = str(self.args[0] if self.args else "").split(_FIELD)
        names = names or {}
        return "".join(names.get(p, p) if i % 2 else p for i, p in enumerate(parts))

    def __str__(self) -> str:
        return self.said()


class InputError(FreezeoptError):
    """A file or option is missing, malformed, of the wrong version or inconsistent."""

    exit_code = 2


class MismatchError(FreezeoptError):
    """A schedule file does not fit the profile or job it is used with."""

    exit_code = 4


class SolverError(FreezeoptError):
    """The solver is missing, failed, or stopped without a usable answer."""

    exit_code = 5


class LpUnsolved(SolverError):
    """The LP relaxation did not reach its optimum (time limit, numerical trouble). `solve` adds how
    to answer without it where the options do not already (`--fallback heuristic`)."""


class RankFailedError(FreezeoptError):
    """A rank crashed or hung; every rank was stopped. `rank` is the first rank that failed and
    `cause` its error, as the rank reported it."""

    def __init__(self, message: str, *, rank: int, cause: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.cause = cause


class DivergedError(FreezeoptError):
    """A run's training loss went non-finite: `train` never recovered (its files are written);
    `profile` stops at the first such step (or gradient), and writes no profile."""

    exit_code = 6


class TrackingError(FreezeoptError):
    """Logging a run to MLflow or TensorBoard failed after the work was done: the run's files
    are written; `freezeopt track RUN` logs them again."""

    exit_code = 7


class StoppedError(FreezeoptError):
    """freezeopt was asked to stop (SIGTERM, SIGHUP, Ctrl-C) and stopped its child processes.

    The exit code follows the shell's convention for a signal: 128 + its number."""

    def __init__(self, message: str, *, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


EXIT_CODES = {
    0: "success",
    1: "other user error",
    2: "bad input: missing, malformed, wrong-version or inconsistent file or option",
    4: "schedule does not fit the profile or job",
    5: "solver missing, failed, or stopped without a solution",
    6: "the training loss went non-finite: train never recovered (the run's files are written), "
    "profile stopped at it (no profile written)",
    7: "logging to MLflow or TensorBoard failed (the run's files are written: `freezeopt track` "
    "logs them again)",
    129: "stopped by SIGHUP (every child process stopped first)",
    130: "interrupted (Ctrl-C)",
    143: "stopped by SIGTERM (every child process stopped first)",
}
