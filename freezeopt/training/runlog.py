"""A training run's logs: `events.jsonl` and `metrics.jsonl` (tracking reads them once the run
has ended: `freezeopt.tracking`).

Rank 0 writes the files; every rank keeps the events (the report counts them). A resumed run
re-runs the steps after its checkpoint, so opening the logs at step `start` drops the metrics of
the steps it will run again. Records are JSON lines with sorted keys, non-finite numbers as
strings (`jsonable`), so every line parses with any JSON reader.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = ["RunLog", "jsonable"]


class RunLog:
    """The logs of one rank's run in `out` (written only where `writes`)."""

    def __init__(self, out: Path, *, writes: bool) -> None:
        self.out, self.writes = out, writes
        self.events: list[dict[str, Any]] = []
        self._files: dict[str, Any] = {}

    def open(self, start: int) -> None:
        """Open the files for appending from step `start` on (a resume keeps earlier steps; a run
        from step 0 replaces what an earlier run in the same folder wrote)."""
        if not self.writes:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        metrics = self.out / "metrics.jsonl"
        if start > 0 and metrics.exists():  # a resumed run re-runs the steps after its checkpoint
            keep = [
                ln
                for ln in metrics.read_text().splitlines()
                if ln.strip() and json.loads(ln).get("step", 0) < start
            ]
            metrics.write_text("".join(ln + "\n" for ln in keep))
        mode = "a" if start > 0 else "w"  # a run from its first step starts the logs afresh
        self._files = {
            "events": open(self.out / "events.jsonl", mode),  # noqa: SIM115 - closed in close()
            "metrics": open(metrics, mode),  # noqa: SIM115
        }
        for ev in self.events:  # events logged before the files were open (resume)
            self._write("events", ev)

    def add_events(self, events: list[dict[str, Any]]) -> None:
        for ev in events:
            self.events.append(ev)
            self._write("events", ev)

    def add_metrics(self, rec: dict[str, Any]) -> None:
        """One step's record (`step` and its figures; `grad_norms` per group)."""
        self._write("metrics", rec)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files = {}

    def _write(self, name: str, obj: dict[str, Any]) -> None:
        f = self._files.get(name)
        if f is not None:
            f.write(json.dumps(jsonable(obj), sort_keys=True, allow_nan=False) + "\n")
            f.flush()


def jsonable(x: Any) -> Any:
    """JSON-ready: non-finite floats as strings ("nan", "inf"), tuples as lists, keys as strings."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return x
