"""Parameter groups of a torchtitan decoder stage: one per decoder layer.

A stage module of torchtitan's pipeline split keeps the whole model's names (`tok_embeddings`,
`layers.<i>`, `norm`, `output`), with the parts of other stages removed. Each decoder layer is a
group named `layers.<i>`; the token embeddings join the first layer's group of their stage and
the final norm and output projection the last layer's, as the built-in tiny GPT groups them, so
the number of groups is the number of decoder layers. A stage with no decoder layer keeps them as
groups of their own (`tok_embeddings`, `output`). The same function groups the stage module a
freezeopt job profiles (`freezeopt.torchtitan.model`) and the one torchtitan trains
(`freezeopt.torchtitan.trainer`), so a schedule solved for one names the other's groups;
wrappers that rename parameters (activation checkpointing, `torch.compile`) are looked through.
"""

from __future__ import annotations

from typing import Any

from freezeopt.errors import InputError

__all__ = ["group_names", "stage_groups"]

_WRAPPERS = ("_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module")


def _plain(name: str) -> str:
    return ".".join(p for p in name.split(".") if p not in _WRAPPERS)


def stage_groups(module: Any) -> dict[str, list[str]]:
    """Group name → the module's trainable parameter names (as `named_parameters` gives them), in
    model order."""
    return group_names([n for n, p in module.named_parameters() if p.requires_grad])


def group_names(params: list[str]) -> dict[str, list[str]]:
    """Group name → the names in `params` (a stage's parameter names, in model order) it holds."""
    named = [(n, _plain(n)) for n in params]
    layers = list(
        dict.fromkeys(".".join(c.split(".")[:2]) for _, c in named if c.startswith("layers."))
    )
    out: dict[str, list[str]] = {}
    head: list[str] = []
    for n, c in named:
        top = c.split(".")[0]
        if top == "layers":
            out.setdefault(".".join(c.split(".")[:2]), []).append(n)
        elif top == "tok_embeddings":
            out.setdefault(layers[0] if layers else "tok_embeddings", []).append(n)
        elif top in ("norm", "output"):
            head.append(n)
        else:
            raise InputError(
                f"parameter {n} is neither a decoder layer's (layers.<i>) nor the embeddings' "
                "(tok_embeddings) or the head's (norm, output): freezeopt groups torchtitan's "
                "decoder models (llama3 and its kind) only"
            )
    if head:
        out.setdefault(layers[-1] if layers else "output", []).extend(head)
    order = {g: i for i, g in enumerate(["tok_embeddings", *layers, "output"])}
    return {g: out[g] for g in sorted(out, key=order.__getitem__)}
