"""Parameter-group fingerprints: what a group holds, so a schedule is never replayed on another model.

A schedule names its groups, but a model of the same shape and group names at another width
(`d_model` 128 instead of 256) has the same names: without more, a schedule solved for one replays
on the other without a word, its timings and sensitivities meaning nothing there. So the profile
records each group's fingerprint (`GroupProfile.fingerprint`), the schedule copies them
(`SchedulePipeline.fingerprints`), and `freezeopt train`, `FreezeController.check_groups` (which
`enable_freezing` calls) and `freezeopt validate --profile` compare them.

A fingerprint is `<n>-<h>`: `n` the group's element count (scalar parameters), `h` the first 16
hex digits of the sha256 of the canonical JSON (no spaces) of the sorted list of the group's
parameters' `[shape, dtype]` (`[[128, 32], "float32"]`; the dtype as torch names it, without
`torch.`). Sorted, so the order of the parameters does not count. Parameter names are left out on
purpose: a loop of one's own hands `enable_freezing` the groups as lists of tensors, without names,
and a wrapper around a stage module (`torch.compile`'s `_orig_mod.`, an activation-checkpoint
wrapper) renames every parameter of an unchanged model; the group names are checked on their own,
and the profile lists the parameter names (`GroupProfile.params`). Pure Python on anything with
`.shape` and `.dtype` (torch tensors on any device, the meta device included): no torch import.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["FINGERPRINT_PATTERN", "fingerprint", "fingerprint_of"]

FINGERPRINT_PATTERN = r"^[0-9]+-[0-9a-f]{16}$"
"""What a fingerprint looks like: element count, a dash, 16 lowercase hex digits."""


def fingerprint_of(entries: Iterable[tuple[Sequence[int], str]]) -> str:
    """The fingerprint of a group whose parameters have these (shape, dtype name) pairs."""
    rows = sorted(([int(d) for d in shape], str(dtype)) for shape, dtype in entries)
    numel = sum(math.prod(shape) for shape, _ in rows)
    text = json.dumps([[shape, dtype] for shape, dtype in rows], separators=(",", ":"))
    return f"{numel}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def fingerprint(params: Iterable[Any]) -> str:
    """The fingerprint of a group of parameters (tensors: anything with `.shape` and `.dtype`)."""
    return fingerprint_of((tuple(p.shape), str(p.dtype).removeprefix("torch.")) for p in params)
