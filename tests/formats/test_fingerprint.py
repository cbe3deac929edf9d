"""Group fingerprints: stable, changed by what a group holds, blind to the order of its parameters."""

from __future__ import annotations

import hashlib
import re

import torch

from freezeopt.formats.fingerprint import FINGERPRINT_PATTERN, fingerprint, fingerprint_of


def _block(width: int, dtype: torch.dtype = torch.float32) -> list[torch.nn.Parameter]:
    return list(torch.nn.Linear(width, 2 * width, dtype=dtype).parameters())


def test_a_fingerprint_is_the_element_count_and_a_hash_that_does_not_drift() -> None:
    """The value is pinned: files hold fingerprints, so a change of the recipe would refuse every
    schedule already solved (bump the file version instead)."""
    fp = fingerprint(_block(128))
    assert re.fullmatch(FINGERPRINT_PATTERN, fp)
    assert fp == "33024-00b71c896dd4706f"
    recipe = b'[[[256],"float32"],[[256,128],"float32"]]'  # the docstring's, by hand
    assert fp == f"{128 * 256 + 256}-{hashlib.sha256(recipe).hexdigest()[:16]}"
    assert fp == fingerprint_of([((256, 128), "float32"), ((256,), "float32")])


def test_shapes_and_dtypes_change_it_the_order_of_parameters_does_not() -> None:
    w, b = _block(128)
    fp = fingerprint([w, b])
    assert fingerprint([b, w]) == fp
    assert fingerprint(_block(64)) != fp  # another width
    assert fingerprint(_block(128, torch.float64)) != fp
    assert fingerprint([w]) != fp  # a parameter fewer
    assert fingerprint([w, b, b]) != fp
    assert fingerprint([w.detach().t(), b]) != fp  # same count, other shape
    assert fingerprint([w.detach().t(), b]).split("-")[0] == fp.split("-")[0]


def test_the_meta_device_and_parameter_names_do_not_change_it() -> None:
    """A model built on the meta device (what `freezeopt train` checks before any process starts)
    has the fingerprint of the real one; names are left out (a wrapper renames parameters)."""
    real = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8))
    with torch.device("meta"):
        meta = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 8))
    assert fingerprint(meta.parameters()) == fingerprint(real.parameters())
    renamed = torch.nn.ModuleDict({"x": real[0], "y": real[1]})
    assert fingerprint(renamed.parameters()) == fingerprint(real.parameters())
