"""The errors freezeopt raises for things a user can fix.

Every message is one line that says what is wrong and how to fix it. The CLI turns these into a
line on stderr and the exit code below, never a traceback.
"""

from __future__ import annotations

__all__ = [
    "EXIT_CODES",
    "FreezeoptError",
    "InfeasibleError",
    "InputError",
    "MismatchError",
    "SolverError",
]


class FreezeoptError(Exception):
    """Base class: a problem the user can fix. `exit_code` is what the CLI exits with."""

    exit_code = 1


class InputError(FreezeoptError):
    """A file or option is missing, malformed, of the wrong version or inconsistent."""

    exit_code = 2


class InfeasibleError(FreezeoptError):
    """The budget and caps cannot all hold."""

    exit_code = 3


class MismatchError(FreezeoptError):
    """A schedule file does not fit the profile or job it is used with."""

    exit_code = 4


class SolverError(FreezeoptError):
    """The solver is missing, failed, or stopped without a usable answer."""

    exit_code = 5


EXIT_CODES = {
    0: "success",
    1: "other user error",
    2: "bad input: missing, malformed, wrong-version or inconsistent file or option",
    3: "infeasible: budget and caps cannot all hold",
    4: "schedule does not fit the profile or job",
    5: "solver missing, failed, or stopped without a solution",
}
