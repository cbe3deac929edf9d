"""Offline data for torchtitan jobs: a byte-level tokenizer and the Python documentation corpus.

torchtitan reads a Hugging Face tokenizer from `--model.hf_assets_path` and text from a dataset
registered by name; its wheel ships neither a tokenizer nor data, and this machine reaches no hub.
`write_tokenizer` writes a tokenizer whose ids are the bytes themselves (0–255, as freezeopt's
`stdlib-bytes` data uses them) plus `<|begin_of_text|>` (256) and `<|end_of_text|>` (257), and
`register_docs` registers `freezeopt-docs`: the documentation topics Python ships for `help()`,
every topic but each 4th (sorted; those are `freezeopt-docs-val`) — the same split as
`stdlib-bytes` with `corpus: docs, val_every: 4`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from freezeopt.fileio import atomic_write_text

__all__ = ["BOS", "EOS", "register_docs", "tokenizer_json", "write_tokenizer"]

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
VAL_EVERY = 4


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte (byte-level BPE's alphabet), in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tokenizer_json() -> str:
    """The tokenizer file's text: a byte-level BPE without merges, ids = byte values."""
    vocab = {c: i for i, c in enumerate(_byte_chars())}
    special = [
        {
            "id": 256 + i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, tok in enumerate((BOS, EOS))
    ]
    spec: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": True,
            "use_regex": False,
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    return json.dumps(spec, ensure_ascii=False, indent=1, sort_keys=True) + "\n"


def write_tokenizer(folder: str | Path) -> Path:
    """Write `tokenizer.json` and `tokenizer_config.json` into `folder` (made if missing); return
    it. Byte-identical on every machine."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "tokenizer.json", tokenizer_json())
    config = {"bos_token": BOS, "eos_token": EOS, "add_bos_token": True, "add_eos_token": True}
    atomic_write_text(out / "tokenizer_config.json", json.dumps(config, indent=1) + "\n")
    return out


def _topics(val: bool) -> list[dict[str, str]]:
    from pydoc_data.topics import topics

    names = sorted(topics)
    return [
        {"text": topics[k]} for i, k in enumerate(names) if (i % VAL_EVERY == VAL_EVERY - 1) == val
    ]


def register_docs() -> None:
    """Register `freezeopt-docs` and `freezeopt-docs-val` in torchtitan's dataset table (no file,
    no download: the dataset is built in memory from `pydoc_data.topics`)."""
    from datasets import Dataset
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    def text(sample: dict[str, Any]) -> str:
        return str(sample["text"])

    for name, val in (("freezeopt-docs", False), ("freezeopt-docs-val", True)):
        DATASETS[name] = DatasetConfig(
            path=name,
            loader=lambda _path, val=val: Dataset.from_list(_topics(val)),
            sample_processor=text,
        )


if __name__ == "__main__":  # python -m freezeopt.torchtitan.data FOLDER
    import sys

    if len(sys.argv) != 2:
        print(
            "usage: python -m freezeopt.torchtitan.data FOLDER (writes the byte tokenizer)",
            file=sys.stderr,
        )
        raise SystemExit(2)
    print(write_tokenizer(sys.argv[1]))
