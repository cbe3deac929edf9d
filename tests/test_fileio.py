"""freezeopt.fileio: atomic writes leave files with the mode a plain `open` would give them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from freezeopt.fileio import atomic_write_text


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.mark.usefixtures("umask")
def test_a_new_file_gets_the_umask_mode_not_the_temporary_files(tmp_path: Path) -> None:
    """mkstemp makes its file 0600; a schedule written on a shared machine must be as readable as
    what `open` creates there (0644 under umask 022, 0600 under 077)."""
    atomic_write_text(tmp_path / "a.yaml", "a\n")
    assert _mode(tmp_path / "a.yaml") == 0o644
    os.umask(0o077)
    atomic_write_text(tmp_path / "b.yaml", "b\n")
    assert _mode(tmp_path / "b.yaml") == 0o600
    (tmp_path / "c.yaml").write_text("plain open\n")
    assert _mode(tmp_path / "c.yaml") == 0o600, "the same as a plain open under that umask"


@pytest.mark.usefixtures("umask")
def test_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    for mode in (0o600, 0o640, 0o664):
        p = tmp_path / f"s{mode:o}.yaml"
        p.write_text("old\n")
        p.chmod(mode)
        atomic_write_text(p, "new\n")
        assert p.read_text() == "new\n" and _mode(p) == mode
    assert sorted(f.name for f in tmp_path.iterdir()) == ["s600.yaml", "s640.yaml", "s664.yaml"]
