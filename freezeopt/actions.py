"""The vocabulary: one pipeline action is `(stage, kind, microbatch)`, written as torch writes it.

`0F3` is the forward of stage 0 on microbatch 3; `B` is a full backward, `I` the backward with
respect to the stage's input and `W` the backward with respect to its weights (split-backward
schedules run `I` and `W` as separate actions). Everything in freezeopt speaks this vocabulary;
only `freezeopt.torchpp.adapter` translates to and from torch's private `_Action` type.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple

__all__ = ["KINDS", "Action", "Kind", "parse_action"]

Kind = Literal["F", "B", "I", "W"]
KINDS: tuple[Kind, ...] = ("F", "B", "I", "W")
_ACTION_RE = re.compile(r"^\s*(\d+)\s*([FBIW])\s*(\d+)\s*$")


class Action(NamedTuple):
    """One compute action of a pipeline schedule.

    A named tuple rather than a frozen dataclass for speed: actions key most of freezeopt's dicts
    (a 64×256 solve hashes about half a million of them) and a tuple hashes in C, where a
    dataclass's `__hash__` is a Python call — a dict of 131 k `(action, group)` keys read back in
    7.8 ms against 36 ms. The same fields, order and immutability; an `Action` also compares equal
    to the plain tuple `(stage, kind, microbatch)`, which nothing relies on.
    """

    stage: int
    kind: Kind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"

    @property
    def is_backward(self) -> bool:
        """True for `B`, `I` and `W`."""
        return self.kind != "F"

    @property
    def has_weight_grad(self) -> bool:
        """True when this action computes weight gradients, the only work freezing can skip."""
        return self.kind in ("B", "W")


def parse_action(text: str) -> Action:
    """Parse `0F3` (also `0B3`, `1I2`, `1W2`) into an `Action`; raise ValueError otherwise."""
    m = _ACTION_RE.match(text)
    if m is None:
        raise ValueError(
            f"{text!r} is not a compute action; write stage, kind (F, B, I or W) and microbatch, e.g. '0F3'"
        )
    kind: Kind = m.group(2)  # type: ignore[assignment]
    return Action(int(m.group(1)), kind, int(m.group(3)))
