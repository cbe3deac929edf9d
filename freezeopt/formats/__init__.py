"""The two files freezeopt writes and reads: profiles (JSON) and schedules (YAML).

Lowest floor of the package: these modules import nothing of freezeopt but `errors` and `fileio`,
so every training rank can read a schedule without the solver. Public: `Profile` with
`load_profile`, `save_profile`, `profile_sha256` (`freezeopt.formats.profile`); `Schedule` with
`load_schedule`, `save_schedule`, `Phases`, `Drift`, `Realisation`, `check_fits`
(`freezeopt.formats.schedule`); `fingerprint`, what a parameter group holds, which both files
record (`freezeopt.formats.fingerprint`). Each module's `__all__` lists the rest of its public names.
"""

from freezeopt.formats.profile import Profile, load_profile, profile_sha256, save_profile
from freezeopt.formats.schedule import (
    Drift,
    Phases,
    Realisation,
    Schedule,
    check_fits,
    load_schedule,
    save_schedule,
)

__all__ = [
    "Drift",
    "Phases",
    "Profile",
    "Realisation",
    "Schedule",
    "check_fits",
    "load_profile",
    "load_schedule",
    "profile_sha256",
    "save_profile",
    "save_schedule",
]
