"""The built-in example: a small byte-level GPT trained on the Python standard library's sources.

Why this job: it is a real language-model workload (causal self-attention, MLPs, layer norms,
a 256-way byte vocabulary) that needs no download and is deterministic for a given Python build,
small enough that a 2-rank pipeline on 2 CPU cores profiles in well under a minute.

Model (`build_model`): `n_layers` pre-norm transformer blocks split evenly over `n_stages`
stages. Stage 0 also holds the token and position embeddings, the last stage the final layer
norm and the output head. Parameter groups: one per block, named `blocks.<i>` with the global
block index; the embeddings join the first block's group and the final norm and head join the
last block's group, so every group holds real weight-gradient work worth freezing.

Data (`stdlib_bytes`): with `corpus: code` (the default) the `.py` files under
`sysconfig.get_paths()["stdlib"]`, walked in sorted order, skipping folders named `site-packages`,
`test` and `idlelib`; with `corpus: docs` the English text of Python's own documentation that the
standard library ships for `help()` (`pydoc_data.topics`: about 0.8 MB of prose on the language,
one document per topic, in sorted topic order) — the shifted domain a model pretrained on the code
is fine-tuned on. Every `val_every`-th file or topic (by position in the sorted list) is held out
for validation, so validation text is never seen in training. Files are concatenated as bytes (separated by a NUL byte) up to `max_train_bytes` /
`max_val_bytes`. A training step samples `batch_size` windows at offsets drawn from a generator
seeded by (seed, step); validation batches are windows at fixed, evenly spaced offsets. The
provenance records the Python version, the number of files and bytes, and the sha256 of both
byte streams: the corpus changes with the Python patch version.
"""

from __future__ import annotations

import hashlib
import math
import os
import platform
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from freezeopt.errors import InputError
from freezeopt.torchpp.job import DataParts, ModelParts

__all__ = ["GPTStage", "TinyGPTConfig", "build_model", "lm_loss", "stdlib_bytes", "stdlib_files"]

VOCAB = 256
_SKIP_DIRS = frozenset({"site-packages", "test", "idlelib"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TinyGPTConfig:
    """Model size knobs (the job's `model_args`)."""

    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 8
    mlp_ratio: int = 4
    head_hidden: int = 0
    """0: a linear LM head. > 0: a two-layer head through this many units, which makes the last
    stage heavier the way a large-vocabulary head does in real models (the unbalanced example)."""


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP, each with a residual."""

    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model)
        self.out = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        h = self.n_heads
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Embed(nn.Module):
    """Token plus learned position embedding."""

    def __init__(self, cfg: TinyGPTConfig, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, cfg.d_model)
        self.pos = nn.Embedding(seq_len, cfg.d_model)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)


class GPTStage(nn.Module):
    """One pipeline stage: optional embedding, a run of blocks, optional final norm and head."""

    def __init__(
        self,
        cfg: TinyGPTConfig,
        seq_len: int,
        first: int,
        last: int,
        *,
        is_first: bool,
        is_last: bool,
    ) -> None:
        super().__init__()
        self.embed = Embed(cfg, seq_len) if is_first else None
        self.blocks = nn.ModuleDict({str(i): Block(cfg) for i in range(first, last)})
        self.norm = nn.LayerNorm(cfg.d_model) if is_last else None
        self.head: nn.Module | None = None
        if is_last:
            self.head = (
                nn.Sequential(
                    nn.Linear(cfg.d_model, cfg.head_hidden),
                    nn.GELU(),
                    nn.Linear(cfg.head_hidden, VOCAB, bias=False),
                )
                if cfg.head_hidden > 0
                else nn.Linear(cfg.d_model, VOCAB, bias=False)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for blk in self.blocks.values():
            x = blk(x)
        if self.norm is not None and self.head is not None:
            x = self.head(self.norm(x))
        return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy of one microbatch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_model(*, n_stages: int, seq_len: int, **model_args: int) -> ModelParts:
    """The tiny GPT split into `n_stages` stages (see the module docstring)."""
    try:
        cfg = TinyGPTConfig(**model_args)
    except TypeError:
        known = ", ".join(TinyGPTConfig.__dataclass_fields__)
        raise InputError(
            f"tiny-gpt model_args accepts {known}; got {', '.join(sorted(model_args))}"
        ) from None
    if (
        min(cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.mlp_ratio) < 1
        or cfg.head_hidden < 0
        or cfg.d_model % cfg.n_heads
    ):
        raise InputError(
            f"tiny-gpt needs positive sizes and d_model ({cfg.d_model}) divisible by n_heads ({cfg.n_heads})"
        )
    if cfg.n_layers % n_stages:
        raise InputError(
            f"tiny-gpt: n_layers {cfg.n_layers} cannot be split evenly over {n_stages} stages; "
            f"set model_args.n_layers to a multiple of {n_stages}"
        )
    per = cfg.n_layers // n_stages
    stages, groups = [], []
    for s in range(n_stages):
        st = GPTStage(
            cfg, seq_len, s * per, (s + 1) * per, is_first=s == 0, is_last=s == n_stages - 1
        )
        stages.append(st)
        g: dict[str, list[str]] = {f"blocks.{i}": [] for i in range(s * per, (s + 1) * per)}
        first_g, last_g = f"blocks.{s * per}", f"blocks.{(s + 1) * per - 1}"
        for name, _ in st.named_parameters():
            top = name.split(".")[0]
            if top == "embed":
                g[first_g].append(name)
            elif top in ("norm", "head"):
                g[last_g].append(name)
            else:
                g[f"blocks.{name.split('.')[1]}"].append(name)
        groups.append(g)
    return ModelParts(stages=stages, loss_fn=lm_loss, groups=groups)


def stdlib_files(root: str | Path | None = None) -> list[Path]:
    """The corpus files: `.py` files under the stdlib, sorted, skipping site-packages/test/idlelib."""
    base = Path(root or sysconfig.get_paths()["stdlib"])
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        out.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return sorted(out, key=lambda p: p.relative_to(base).as_posix())


def _docs() -> list[bytes]:
    """The documentation topics `help()` shows, as UTF-8 bytes, in sorted topic order."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return []
    return [topics[k].encode() for k in sorted(topics)]


def stdlib_bytes(
    *,
    batch_size: int,
    seq_len: int,
    seed: int,
    max_train_bytes: int = 4_000_000,
    max_val_bytes: int = 400_000,
    val_every: int = 10,
    corpus: str = "code",
) -> DataParts:
    """Byte-level language-modelling data from the stdlib sources or its documentation (see the
    module docstring)."""
    if val_every < 2:
        raise InputError(
            "stdlib-bytes: val_every must be at least 2 (every val_every-th file is held out)"
        )
    if corpus not in ("code", "docs"):
        raise InputError(f"stdlib-bytes: corpus is code or docs, not {corpus!r}")
    docs = _docs() if corpus == "docs" else []
    base = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files(base) if corpus == "code" else []
    if not files and not docs:
        what = "no .py files under " + str(base) if corpus == "code" else "no pydoc_data topics"
        raise InputError(f"stdlib-bytes: {what}; use another data source")
    train_parts: list[bytes] = []
    val_parts: list[bytes] = []
    n_train = n_val = 0
    sources: list[Path | bytes] = [*files, *docs]  # one of the two is empty
    for i, f in enumerate(sources):
        is_val = i % val_every == val_every - 1
        if (n_val if is_val else n_train) >= (max_val_bytes if is_val else max_train_bytes):
            if n_train >= max_train_bytes and n_val >= max_val_bytes:
                break
            continue
        b = (f.read_bytes() if isinstance(f, Path) else f) + b"\0"
        (val_parts if is_val else train_parts).append(b)
        if is_val:
            n_val += len(b)
        else:
            n_train += len(b)
    train = b"".join(train_parts)[:max_train_bytes]
    val = b"".join(val_parts)[:max_val_bytes]
    if len(train) <= seq_len + 1 or len(val) <= seq_len + 1:
        raise InputError(f"stdlib-bytes: corpus too small for seq_len {seq_len}; lower seq_len")
    train_t = torch.frombuffer(bytearray(train), dtype=torch.uint8).long()
    val_t = torch.frombuffer(bytearray(val), dtype=torch.uint8).long()

    def windows(data: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = offsets[:, None] + torch.arange(seq_len + 1)[None, :]
        w = data[idx]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def train_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return windows(
            train_t, torch.randint(0, len(train) - seq_len - 1, (batch_size,), generator=g)
        )

    n_windows = len(val) - seq_len - 1

    def val_batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        stride = max(1, n_windows // max(1, batch_size * 64))
        start = (i * batch_size * stride) % max(1, n_windows - batch_size * stride)
        offs = torch.arange(batch_size) * stride + start
        return windows(val_t, offs)

    return DataParts(
        train=train_batch,
        val=val_batch,
        provenance={
            "corpus": "python-stdlib-py" if corpus == "code" else "python-pydoc-topics",
            "python": platform.python_version(),
            "files": len(files or docs),
            "train_bytes": len(train),
            "val_bytes": len(val),
            "train_sha256": hashlib.sha256(train).hexdigest(),
            "val_sha256": hashlib.sha256(val).hexdigest(),
            "val_every": val_every,
            "bits_per_byte_uniform": math.log2(VOCAB),
        },
    )
