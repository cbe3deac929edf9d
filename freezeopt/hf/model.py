"""A Hugging Face causal LM split into pipeline stages: `model: hf:<source>` in a job spec.

Why a manual split by decoder layers (not torch's tracer): every stage is a plain module whose
parameters keep transformers' own names (`model.layers.3.mlp.up_proj.weight`,
`transformer.h.3.attn.c_attn.weight`), so safetensors weights load by name, the groups are one
per decoder layer without pattern guessing, and each stage recomputes what the model computes
from position ids (rotary embeddings for Llama and Qwen2, learned positions for GPT-2 on the
first stage) and its own causal mask, instead of carrying them through the pipeline.

`build_model(source=..., n_stages=..., seq_len=..., **model_args)` (the job's `model_args`):

* `config`: mapping of config fields to override (sizes of a random-init model, e.g.
  `hidden_size`, `num_hidden_layers`; any field of the family's transformers config);
* `init`: `auto` (weights when the source has them, else random), `random` or `pretrained`;
* `layers`: keep only the first N decoder layers (the model's own norm and head stay on top);
* `split`: decoder layers per stage, e.g. `[3, 1]`; default even, the first stages taking one
  more when the count does not divide;
* `groups_of`: decoder layers per parameter group (default 1: one group `layers.<i>` per
  layer, global index; k > 1 merges runs of k within a stage into `layers.<a>-<b>`);
* `ends`: `own` (default) puts the embeddings in a group `embed` on the first stage and the
  final norm and LM head in a group `head` on the last; `join` adds them to the first and last
  layer group. The job's own `groups` patterns override all of this (split or merge freely);
* `tie`: for models whose input embedding and LM head share one weight (GPT-2, SmolLM2):
  `sync` (default) — the first and last stage hold equal copies, and before every optimizer step
  their gradients are summed across the ranks that hold them (`ModelParts.tied`), so the copies
  get identical updates and stay bit-equal, as in the unsplit model; a tied copy whose group is
  frozen still receives the other end's gradient. `untie` — independent copies from the same
  start (a model with more parameters than the original);
* `dropout`: value for every dropout probability of the config (default 0.0, so a step is a
  function of weights and data alone; None keeps the config's);
* `attn_implementation`: transformers' attention kernel (default `sdpa`).

Supported families: Llama, Qwen2 and GPT-2 (`freezeopt.hf.source.ARCHITECTURES`); Llama-shaped
checkpoints such as SmolLM2 load as `llama`. Weights are float32.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch
from torch import nn
from torch.nn import functional as F

from freezeopt.errors import InputError, short
from freezeopt.hf import require_transformers
from freezeopt.hf.source import ARCHITECTURES, TINY_CONFIGS, Source, gguf_folder, locate
from freezeopt.torchpp.job import ModelParts

__all__ = ["HFModelArgs", "HFStage", "build_model", "lm_loss", "load_config", "split_layers"]

_DROPOUT_FIELDS = (
    "attention_dropout",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "summary_first_dropout",
    "hidden_dropout",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HFModelArgs:
    """The `model_args` of an `hf:` model (see the module docstring)."""

    config: Mapping[str, Any] = field(default_factory=dict)
    init: Literal["auto", "random", "pretrained"] = "auto"
    layers: int | None = None
    split: tuple[int, ...] | None = None
    groups_of: int = 1
    ends: Literal["own", "join"] = "own"
    tie: Literal["sync", "untie"] = "sync"
    dropout: float | None = 0.0
    attn_implementation: str = "sdpa"

    def __post_init__(self) -> None:
        if not isinstance(self.config, Mapping):
            raise InputError("hf model_args.config must be a mapping of config fields")
        for name, allowed in (
            ("init", ("auto", "random", "pretrained")),
            ("ends", ("own", "join")),
            ("tie", ("sync", "untie")),
        ):
            if getattr(self, name) not in allowed:
                raise InputError(
                    f"hf model_args.{name} is {getattr(self, name)!r}; use one of {', '.join(allowed)}"
                )
        if self.layers is not None and (not isinstance(self.layers, int) or self.layers < 1):
            raise InputError(f"hf model_args.layers is {self.layers!r}; use a positive integer")
        if not isinstance(self.groups_of, int) or self.groups_of < 1:
            raise InputError(
                f"hf model_args.groups_of is {self.groups_of!r}; use a positive integer"
            )
        if self.dropout is not None and not 0.0 <= float(self.dropout) < 1.0:
            raise InputError(f"hf model_args.dropout is {self.dropout!r}; use 0 <= dropout < 1")

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> HFModelArgs:
        """From the job's `model_args`; InputError naming the fields when one is unknown."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise InputError(
                f"hf model_args has unknown field(s) {', '.join(unknown)}; it accepts {', '.join(sorted(known))}"
            )
        args = dict(raw)
        if args.get("split") is not None:
            sp = args["split"]
            if not isinstance(sp, (list, tuple)) or not all(
                isinstance(k, int) and not isinstance(k, bool) for k in sp
            ):
                raise InputError(
                    f"hf model_args.split is {short(sp)}; give decoder layers per stage, e.g. [3, 1]"
                )
            args["split"] = tuple(sp)
        return cls(**args)


def load_config(src: Source, overrides: Mapping[str, Any]) -> Any:
    """The transformers config of `src`, with `overrides` applied; InputError for an unknown
    architecture or a bad field."""
    transformers = require_transformers()
    try:
        if src.kind == "arch":
            cls = getattr(transformers, ARCHITECTURES[src.spec])
            cfg = cls(**{**TINY_CONFIGS[src.spec], **overrides})
        elif src.kind == "config":
            assert src.path is not None
            try:
                data = json.loads(src.path.read_text())
            except (OSError, ValueError) as e:
                raise InputError(
                    f"model hf:{src.spec}: cannot read the config ({e}); give a JSON file"
                ) from None
            if not isinstance(data, dict):
                raise InputError(f"model hf:{src.spec}: the config is not a JSON object")
            model_type = data.pop("model_type", None)
            _check_arch(src, model_type)
            cfg = transformers.AutoConfig.for_model(model_type, **{**data, **overrides})
        else:
            assert src.path is not None
            folder = gguf_folder(src.path) if src.kind == "gguf" else src.path
            with open(folder / "config.json") as f:
                _check_arch(src, json.load(f).get("model_type"))
            cfg = transformers.AutoConfig.from_pretrained(
                str(folder), local_files_only=True, **overrides
            )
    except InputError:
        raise
    except (TypeError, ValueError, OSError, KeyError, AttributeError) as e:
        raise InputError(
            f"model hf:{src.spec}: transformers rejected the config ({short(e, 160)}); "
            "check model_args.config"
        ) from None
    _check_arch(src, getattr(cfg, "model_type", None))
    return cfg


def _check_arch(src: Source, model_type: Any) -> None:
    if model_type not in ARCHITECTURES:
        raise InputError(
            f"model hf:{src.spec}: unknown architecture {model_type!r}; freezeopt splits "
            f"{', '.join(ARCHITECTURES)} (config model_type)"
        )


def split_layers(n_layers: int, n_stages: int, split: Sequence[int] | None) -> list[int]:
    """Decoder layers per stage: `split` checked, or an even split (first stages take the rest)."""
    if split is None:
        if n_layers < n_stages:
            raise InputError(
                f"hf model: {n_layers} decoder layer(s) cannot fill {n_stages} stages; "
                f"keep more layers or use fewer ranks/stages"
            )
        base, extra = divmod(n_layers, n_stages)
        return [base + (1 if s < extra else 0) for s in range(n_stages)]
    if len(split) != n_stages or any(k < 1 for k in split) or sum(split) != n_layers:
        raise InputError(
            f"hf model_args.split {list(split)} does not fit: give {n_stages} positive counts "
            f"that add up to the model's {n_layers} decoder layers"
        )
    return list(split)


class HFStage(nn.Module):
    """One pipeline stage of a Hugging Face causal LM: optional embeddings, a run of decoder
    layers (global indices as names), optional final norm and LM head. Parameter names are
    transformers' own."""

    def __init__(
        self,
        config: Any,
        *,
        layers: Mapping[int, nn.Module],
        embed: nn.Module | None = None,
        pos_embed: nn.Module | None = None,
        norm: nn.Module | None = None,
        head: nn.Module | None = None,
        rotary: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.gpt2 = config.model_type == "gpt2"
        self.cfg = config
        self.is_first = embed is not None
        self.is_last = head is not None
        body: Any = nn.Module()  # holds the submodules under transformers' names
        blocks = nn.ModuleDict({str(i): m for i, m in layers.items()})
        if self.gpt2:
            if embed is not None:
                body.wte = embed
                body.wpe = pos_embed
                body.drop = nn.Dropout(config.embd_pdrop)
            body.h = blocks
            if norm is not None:
                body.ln_f = norm
            self.transformer = body
        else:
            if embed is not None:
                body.embed_tokens = embed
            body.layers = blocks
            if norm is not None:
                body.norm = norm
            body.rotary_emb = rotary
            self.model = body
        if head is not None:
            self.lm_head = head
        types = getattr(config, "layer_types", None)
        self.layer_types = {
            i: (types[i] if types and i < len(types) else "full_attention") for i in layers
        }

    def _masks(self, h: torch.Tensor, pos: torch.Tensor) -> dict[str, Any]:
        from transformers.masking_utils import (
            create_causal_mask,
            create_sliding_window_causal_mask,
        )

        kw = {
            "config": self.cfg,
            "inputs_embeds": h,
            "attention_mask": None,
            "cache": None,
            "position_ids": pos,
        }
        out: dict[str, Any] = {}
        for t in set(self.layer_types.values()):
            make = (
                create_sliding_window_causal_mask
                if t == "sliding_attention"
                else create_causal_mask
            )
            out[t] = make(**kw)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        if self.gpt2:
            body: Any = self.transformer
            h = body.drop(body.wte(x) + body.wpe(pos)) if self.is_first else x
            masks = self._masks(h, pos)
            for i, blk in body.h.items():
                h = blk(h, None, masks[self.layer_types[int(i)]], position_ids=pos)
            if self.is_last:
                h = body.ln_f(h)
        else:
            body = self.model
            h = body.embed_tokens(x) if self.is_first else x
            masks = self._masks(h, pos)
            pe = body.rotary_emb(h, position_ids=pos)
            for i, layer in body.layers.items():
                h = layer(
                    h,
                    attention_mask=masks[self.layer_types[int(i)]],
                    position_embeddings=pe,
                    position_ids=pos,
                )
            if self.is_last:
                h = body.norm(h)
        return self.lm_head(h) if self.is_last else h


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one microbatch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _full_model(src: Source, cfg: Any, args: HFModelArgs, on_meta: bool) -> Any:
    transformers = require_transformers()
    pretrained = args.init == "pretrained" or (args.init == "auto" and src.has_weights)
    if args.init == "pretrained" and not src.has_weights:
        raise InputError(
            f"model hf:{src.spec}: init is pretrained but the source has no weights "
            "(*.safetensors or a .gguf); set init: random or point at the weights"
        )
    auto = transformers.AutoModelForCausalLM
    if not pretrained or on_meta:  # on the meta device only the shapes matter
        return auto.from_config(cfg, dtype=torch.float32)
    assert src.path is not None
    folder = gguf_folder(src.path) if src.kind == "gguf" else src.path
    try:
        return auto.from_pretrained(
            str(folder), config=cfg, dtype=torch.float32, local_files_only=True
        )
    except (OSError, ValueError, RuntimeError) as e:
        raise InputError(
            f"model hf:{src.spec}: cannot load its weights ({short(e, 160)}); check the folder's "
            "*.safetensors files"
        ) from None


def build_model(*, source: str, n_stages: int, seq_len: int, **model_args: Any) -> ModelParts:
    """The model `source` names, split into `n_stages` stages (see the module docstring)."""
    args = HFModelArgs.parse(model_args)
    src = locate(source)
    overrides = dict(args.config)
    if args.layers is not None:
        overrides["num_hidden_layers"] = args.layers
    cfg = load_config(src, overrides)
    if args.layers is not None:
        types = getattr(cfg, "layer_types", None)
        if types is not None and len(types) > args.layers:
            cfg.layer_types = list(types)[: args.layers]
    if args.dropout is not None:
        for f in _DROPOUT_FIELDS:
            if hasattr(cfg, f):
                setattr(cfg, f, float(args.dropout))
    cfg._attn_implementation = args.attn_implementation
    max_pos = getattr(cfg, "max_position_embeddings", None)
    if max_pos is not None and seq_len > max_pos:
        raise InputError(
            f"model hf:{source}: seq_len {seq_len} exceeds the model's max_position_embeddings "
            f"{max_pos}; lower seq_len"
        )
    on_meta = torch.get_default_device().type == "meta"
    full = _full_model(src, cfg, args, on_meta)
    gpt2 = cfg.model_type == "gpt2"
    base = full.transformer if gpt2 else full.model
    blocks = list(base.h if gpt2 else base.layers)
    if args.layers is not None and len(blocks) > args.layers:
        blocks = blocks[: args.layers]
    per = split_layers(len(blocks), n_stages, args.split)
    embed = base.wte if gpt2 else base.embed_tokens
    tied = full.lm_head.weight is embed.weight
    stages: list[HFStage] = []
    starts = [sum(per[:s]) for s in range(n_stages)]
    for s in range(n_stages):
        first, last = s == 0, s == n_stages - 1
        head = full.lm_head if last else None
        if last and tied and n_stages > 1:  # the last stage's own copy of the shared weight
            head = nn.Linear(embed.weight.shape[1], embed.weight.shape[0], bias=False)
            head.weight = nn.Parameter(embed.weight.detach().clone())
        stages.append(
            HFStage(
                cfg,
                layers={i: blocks[i] for i in range(starts[s], starts[s] + per[s])},
                embed=embed if first else None,
                pos_embed=(base.wpe if gpt2 else None) if first else None,
                norm=(base.ln_f if gpt2 else base.norm) if last else None,
                head=head,
                rotary=None if gpt2 else base.rotary_emb,
            )
        )
    groups = [_stage_groups(st, args, gpt2) for st in stages]
    ties: list[tuple[tuple[int, str], ...]] = []
    if tied and n_stages > 1 and args.tie == "sync":
        emb_name = "transformer.wte.weight" if gpt2 else "model.embed_tokens.weight"
        ties.append(((0, emb_name), (n_stages - 1, "lm_head.weight")))
    return ModelParts(stages=stages, loss_fn=lm_loss, groups=groups, tied=tuple(ties))


def _stage_groups(st: HFStage, args: HFModelArgs, gpt2: bool) -> dict[str, list[str]]:
    """Group name → parameter names of one stage, in model order."""
    layer_key = "h" if gpt2 else "layers"
    idx = sorted(st.layer_types)
    runs = [idx[i : i + args.groups_of] for i in range(0, len(idx), args.groups_of)]
    name_of = {
        i: (f"layers.{r[0]}" if len(r) == 1 else f"layers.{r[0]}-{r[-1]}") for r in runs for i in r
    }
    first_g, last_g = name_of[idx[0]], name_of[idx[-1]]
    out: dict[str, list[str]] = {}
    if st.is_first and args.ends == "own":
        out["embed"] = []
    for r in runs:
        out[name_of[r[0]]] = []
    if st.is_last and args.ends == "own":
        out["head"] = []
    for n, p in st.named_parameters():
        if not p.requires_grad:
            continue
        parts = n.split(".")
        if len(parts) > 2 and parts[1] == layer_key:
            out[name_of[int(parts[2])]].append(n)
        elif parts[0] == "lm_head" or parts[1] in ("norm", "ln_f"):
            out["head" if args.ends == "own" else last_g].append(n)
        else:
            out["embed" if args.ends == "own" else first_g].append(n)
    return {g: ms for g, ms in out.items() if ms}
