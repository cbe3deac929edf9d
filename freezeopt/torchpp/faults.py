"""Test-only faults: the drifts and failures tests inject into a real run of `freezeopt profile`
or `freezeopt train`, in one vocabulary for both.

Why a module of its own: the drift rules, the fallback and the rollback can only be proven on a run
that really drifts, and crash handling and resumption only on one that really fails; these are
the ways a test makes that happen. They are never on by default: `TrainOptions(fault=...)` or the
hidden `--fault` option of `freezeopt train` (`profile_job(fault=...)` or `FREEZEOPT_FAULT` for
`freezeopt profile`, which takes one rank fault or `nan_loss`), several separated by `;`:

* `lr_spike:step=K[,factor=F]` multiplies the learning rate by F (default 100) for step K;
* `corrupt_batch:step=K[,steps=N]` replaces the batches of N steps (default 1) from step K on with
  random data of the same shape and kind;
* `slow:stage=S,ms=X[,step=K]` spins X ms of CPU time in every action of stage S from step K on
  (busy, so the stage is slower, not idle);
* `nan_loss:step=K[,steps=N]` makes the loss of N steps (default 1) from step K on NaN (every
  microbatch; `train` skips the update, `profile` stops there with `DivergedError`);
* `corrupt_checkpoint:step=K[,rank=R]` flips one byte of rank R's file (default 0) in the newest
  checkpoint at the start of step K, as a failing disk would;
* `crash:rank=R,step=K`, `kill:…` and `hang:…` (`RANK_FAULTS`): rank R raises, dies of SIGKILL
  or blocks forever in its first forward of step K;
* `slow_replan:ms=X` makes the solver process wait X ms before each re-plan (a re-plan still
  solving when the run ends).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal

from freezeopt.errors import InputError

__all__ = ["RANK_FAULTS", "Fault", "FaultKind", "corrupt", "damage_file", "parse_faults"]

FaultKind = Literal[
    "lr_spike",
    "corrupt_batch",
    "slow",
    "nan_loss",
    "corrupt_checkpoint",
    "crash",
    "kill",
    "hang",
    "slow_replan",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Fault:
    """A test-only injected fault (see the module docstring)."""

    kind: FaultKind
    step: int = 0
    rank: int = 0
    stage: int = 0
    factor: float = 100.0
    ms: float = 0.0
    steps: int = 1
    """`corrupt_batch`, `nan_loss`: how many consecutive steps from `step` on."""


_FAULT_FIELDS: dict[str, tuple[set[str], set[str]]] = {  # kind → (required, optional)
    "lr_spike": ({"step"}, {"factor"}),
    "corrupt_batch": ({"step"}, {"steps"}),
    "slow": ({"stage", "ms"}, {"step"}),
    "nan_loss": ({"step"}, {"steps"}),
    "corrupt_checkpoint": ({"step"}, {"rank"}),
    "crash": ({"rank", "step"}, set()),
    "kill": ({"rank", "step"}, set()),
    "hang": ({"rank", "step"}, set()),
    "slow_replan": ({"ms"}, set()),
}
_FAULT_RE = re.compile(r"^([a-z_]+):(.*)$")
RANK_FAULTS: tuple[FaultKind, ...] = ("crash", "kill", "hang")
"""The faults a rank process suffers (the ones `freezeopt profile` takes)."""
TRAIN_HINT = "write e.g. lr_spike:step=12,factor=100 or corrupt_batch:step=12 or slow:stage=1,ms=20"


def parse_faults(
    text: str, *, kinds: tuple[FaultKind, ...] | None = None, hint: str = TRAIN_HINT
) -> tuple[Fault, ...]:
    """Parse `lr_spike:step=12;slow:stage=1,ms=20,step=5` (faults separated by `;`), of `kinds`
    only where given; `hint` ends each error."""
    out: list[Fault] = []
    allowed = kinds if kinds is not None else tuple(_FAULT_FIELDS)
    for part in filter(None, (p.strip() for p in text.replace(" ", "").split(";"))):
        m = _FAULT_RE.match(part)
        if m is None or m.group(1) not in allowed:
            raise InputError(f"fault {part!r} is malformed; {hint}")
        kind, body = m.group(1), m.group(2)
        values: dict[str, float] = {}
        for kv in filter(None, body.split(",")):
            k, sep, v = kv.partition("=")
            try:
                values[k] = float(v)
            except ValueError:
                raise InputError(f"fault {part!r}: {kv!r} is not key=number; {hint}") from None
            if not sep:
                raise InputError(f"fault {part!r}: {kv!r} is not key=number; {hint}")
            if not math.isfinite(values[k]):
                raise InputError(f"fault {part!r}: {kv!r} is not a finite number; {hint}")
        need, opt = _FAULT_FIELDS[kind]
        unknown = sorted(set(values) - need - opt)
        missing = sorted(need - set(values))
        if unknown or missing:
            what = f"unknown {unknown[0]!r}" if unknown else f"missing {missing[0]!r}"
            raise InputError(f"fault {part!r}: {what}; {hint}")
        ints = {k: int(v) for k, v in values.items() if k in ("step", "rank", "stage", "steps")}
        if any(v < 0 for v in ints.values()) or values.get("ms", 0) < 0:
            raise InputError(f"fault {part!r}: values must not be negative")
        out.append(
            Fault(
                kind=kind,  # type: ignore[arg-type]
                factor=values.get("factor", 100.0),
                ms=values.get("ms", 0.0),
                **ints,
            )
        )
    return tuple(out)


def corrupt(t: Any, seed: int) -> Any:
    """Random data of `t`'s shape and kind (test-only fault): integers in its range, or noise."""
    import torch

    if not isinstance(t, torch.Tensor):
        return t
    g = torch.Generator().manual_seed(1_000_003 + seed)
    if t.dtype.is_floating_point:
        scale = float(t.float().std()) if t.numel() > 1 else 1.0
        return torch.randn(t.shape, generator=g, dtype=t.dtype) * 10 * max(scale, 1.0)
    lo, hi = int(t.min()), int(t.max())
    return torch.randint(lo, hi + 1, t.shape, generator=g, dtype=t.dtype)


def damage_file(path: Any) -> None:
    """Flip one byte in the middle of a file, in place (test-only fault: a failing disk)."""
    with open(path, "r+b") as f:
        f.seek(0, 2)
        mid = f.tell() // 2
        f.seek(mid)
        b = f.read(1)
        f.seek(mid)
        f.write(bytes([b[0] ^ 0xFF]) if b else b"\xff")
