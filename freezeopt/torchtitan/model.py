"""A torchtitan decoder as a freezeopt job: `model: freezeopt.torchtitan.model:llama3`.

`freezeopt profile` measures a job whose stage modules are those torchtitan trains: the model is
torchtitan's own `Transformer` (from `torchtitan.models.llama3`, a flavor of `llama3_args` with
optional overrides), split into stages as torchtitan's `pipeline_llm` splits it (the module names
of `generate_llm_fqn_per_model_part` with torchtitan's default weights, then every other part
removed, as `pipeline_module_split` does), grouped one group per decoder layer
(`freezeopt.torchtitan.groups`). The schedule solved from that profile carries the groups'
fingerprints (shapes and dtypes), which torchtitan's stages match, so `FreezeTrainer` replays it.
The loss is the mean token cross-entropy (torchtitan's is the sum over the global token count: the
same gradient direction and, per step, a constant factor).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from freezeopt.errors import InputError
from freezeopt.torchpp.job import ModelParts
from freezeopt.torchtitan import require_torchtitan
from freezeopt.torchtitan.groups import stage_groups

__all__ = ["llama3", "split_names"]


def split_names(n_stages: int, n_layers: int) -> list[list[str]]:
    """The module names of each stage, as torchtitan's pipeline split chooses them."""
    from torchtitan.distributed.pipeline_parallel import generate_llm_fqn_per_model_part

    return generate_llm_fqn_per_model_part(n_stages, n_layers, 1, 1)


def _keep(model: Any, names: list[str]) -> Any:
    """A copy of `model` with only the modules `names` (torchtitan's `pipeline_module_split`)."""
    import torch

    part = copy.deepcopy(model)
    keep = set(names)
    for child, mod in list(part.named_children()):
        if isinstance(mod, torch.nn.ModuleDict):
            wanted = {n.split(".", 1)[1] for n in keep if n.startswith(child + ".")}
            for key in list(mod.keys()):
                if key not in wanted:
                    del mod[key]
        elif child not in keep:
            setattr(part, child, None)
    return part


def _loss(logits: Any, targets: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def llama3(
    *, n_stages: int, seq_len: int, flavor: str = "debugmodel", **overrides: Any
) -> ModelParts:
    """torchtitan's llama3 `flavor` (sizes in `overrides`: dim, n_layers, n_heads, vocab_size, …)
    split into `n_stages` stages."""
    require_torchtitan()
    import torch
    from torchtitan.models.llama3 import Transformer, llama3_args

    if flavor not in llama3_args:
        raise InputError(
            f"torchtitan llama3 has no flavor {flavor!r}; use one of {', '.join(sorted(llama3_args))}"
        )
    args = copy.deepcopy(llama3_args[flavor])
    known = {f.name for f in dataclasses.fields(args)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise InputError(
            f"torchtitan llama3 model_args has no field {bad[0]}; fields: {', '.join(sorted(known))}"
        )
    for k, v in overrides.items():
        setattr(args, k, v)
    args.max_seq_len = seq_len
    if args.attn_type != "sdpa":
        raise InputError(
            f"flavor {flavor!r} uses {args.attn_type} attention, which has no CPU backward; "
            "use an sdpa flavor (debugmodel)"
        )
    model = Transformer(args)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    names = split_names(n_stages, args.n_layers)
    if len(names) != n_stages:
        raise InputError(
            f"torchtitan split {args.n_layers} layers into {len(names)} stages, not {n_stages}"
        )
    stages = [_keep(model, n) for n in names]
    return ModelParts(stages=stages, loss_fn=_loss, groups=[stage_groups(st) for st in stages])
