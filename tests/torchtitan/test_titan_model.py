"""torchtitan's llama3 as a freezeopt job: split as torchtitan splits it, grouped per layer."""

from __future__ import annotations

import pytest

pytest.importorskip(
    "torchtitan", reason="needs the freezeopt[torchtitan] extra (make test installs it)"
)

import torch

from freezeopt.errors import InputError
from freezeopt.torchtitan.model import llama3, split_names


def test_stages_hold_what_torchtitan_puts_on_them_and_chain() -> None:
    parts = llama3(n_stages=2, seq_len=16, flavor="debugmodel")
    names = split_names(2, 6)
    assert names[0][0] == "tok_embeddings" and names[-1][-2:] == ["norm", "output"]
    for st, keep in zip(parts.stages, names, strict=True):
        layers = [f"layers.{k}" for k in st.layers]
        assert layers == [n for n in keep if n.startswith("layers.")]
    assert [list(g) for g in parts.groups] == [
        ["layers.0", "layers.1", "layers.2"],
        ["layers.3", "layers.4", "layers.5"],
    ]
    x = torch.randint(0, 256, (2, 16))
    with torch.no_grad():
        logits = parts.stages[1](parts.stages[0](x))
    assert logits.shape == (2, 16, 2048)
    assert 7.0 < float(parts.loss_fn(logits, x)) < 8.5  # about ln(2048) at initialisation


def test_model_args_are_checked() -> None:
    with pytest.raises(InputError, match="no flavor 'tiny'"):
        llama3(n_stages=2, seq_len=16, flavor="tiny")
    with pytest.raises(InputError, match="no field widht"):
        llama3(n_stages=2, seq_len=16, widht=3)
    small = llama3(n_stages=2, seq_len=16, n_layers=4, dim=64, n_heads=4)
    assert [len(g) for g in small.groups] == [2, 2]
