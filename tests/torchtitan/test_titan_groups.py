"""One parameter group per decoder layer of a torchtitan stage, on the profiled and the trained side alike."""

from __future__ import annotations

import pytest

from freezeopt.errors import InputError
from freezeopt.torchtitan.groups import group_names


def test_a_middle_stage_has_a_group_per_layer() -> None:
    names = [f"layers.{i}.{w}" for i in (2, 3) for w in ("attention.wq.weight", "ffn_norm.weight")]
    assert group_names(names) == {
        "layers.2": names[:2],
        "layers.3": names[2:],
    }


def test_embeddings_and_head_join_the_first_and_last_layer_of_their_stage() -> None:
    names = ["tok_embeddings.weight", "layers.0.w", "layers.1.w", "norm.weight", "output.weight"]
    assert group_names(names) == {
        "layers.0": ["tok_embeddings.weight", "layers.0.w"],
        "layers.1": ["layers.1.w", "norm.weight", "output.weight"],
    }
    # a stage without layers keeps them as groups of their own, in model order
    assert list(group_names(["tok_embeddings.weight", "norm.weight", "output.weight"])) == [
        "tok_embeddings",
        "output",
    ]


def test_wrappers_that_rename_parameters_are_looked_through() -> None:
    wrapped = ["layers.0._checkpoint_wrapped_module.w", "_orig_mod.layers.1.w"]
    assert group_names(wrapped) == {"layers.0": [wrapped[0]], "layers.1": [wrapped[1]]}


def test_a_parameter_outside_a_decoder_is_refused() -> None:
    with pytest.raises(InputError, match=r"rotary\.freqs"):
        group_names(["layers.0.w", "rotary.freqs"])
