"""Log a `TrackedRun` as TensorBoard event files: one sub-folder per run.

Written with torch's `SummaryWriter` (the `tensorboard` extra supplies the event-file writer):
the scalars under their own names (`loss`, `step_ms`, `grad_norm/…`), the events, the schedule
and the report as text, PNG artifacts (the Gantt chart, a comparison's figures) as images. A
comparison's runs go into sub-folders of its own, so TensorBoard shows them side by side.
"""

from __future__ import annotations

import re
from pathlib import Path

from freezeopt.tracking.record import TrackedRun

__all__ = ["log_tensorboard", "run_folder_name"]


def run_folder_name(name: str) -> str:
    """A run's sub-folder: its name with anything but letters, digits, `._-` as `_`."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).strip("._") or "run"


def log_tensorboard(run: TrackedRun, root: Path) -> Path:
    """Write `run` under `root` (a fresh sub-folder per call); the folder written."""
    folder = _fresh(Path(root) / run_folder_name(run.name))
    _write(run, folder)
    for child in run.children:
        _write(child, folder / run_folder_name(child.name))
    return folder


def _write(run: TrackedRun, folder: Path) -> None:
    import matplotlib.image as mpimg
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(folder))
    try:
        for s in run.scalars:
            w.add_scalar(s.key, s.value, s.step)
        params = "\n".join(f"| {k} | {v} |" for k, v in run.params)
        w.add_text("params", "| parameter | value |\n|---|---|\n" + params, 0)
        w.add_text("status", run.status, 0)
        for title, text in run.texts:
            w.add_text(title, text, 0)
        for a in run.artifacts:
            if a.path.suffix == ".png" and a.path.is_file():
                img = mpimg.imread(str(a.path))
                w.add_image(f"{a.folder or 'figures'}/{a.path.stem}", img, 0, dataformats="HWC")
    finally:
        w.close()


def _fresh(folder: Path) -> Path:
    """`folder`, or `folder-2`, `folder-3`, … where it is taken (a run logged twice keeps both)."""
    if not folder.exists():
        return folder
    n = 2
    while folder.with_name(f"{folder.name}-{n}").exists():
        n += 1
    return folder.with_name(f"{folder.name}-{n}")
