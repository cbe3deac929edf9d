"""A local text corpus tokenized with a model's tokenizer: `data: hf-text` in a job spec.

`text_corpus(batch_size=..., seq_len=..., seed=..., **data_args)` (the job's `data_args`):

* `root`: the corpus folder (relative to the job file), or `stdlib` for the Python standard
  library's folder (`sysconfig`), which every machine has;
* `files`: glob patterns under `root` (default `["**/*.txt"]`); matches are read in sorted order
  of their relative paths, as UTF-8 (undecodable bytes replaced);
* `tokenizer`: the model's tokenizer by default (an `hf:` model's folder or GGUF file); else a
  folder with tokenizer files, a `tokenizer.json`, a `.gguf` file, `pkg:<package>/<path>`, or
  `bytes` (UTF-8 bytes, vocabulary 256: for random-init models named by architecture);
* `val_every` (default 10): every `val_every`-th file (by sorted position) is held out for
  validation; a corpus of fewer files holds out the last 1/`val_every` of its token stream;
* `max_train_tokens` (default 2,000,000) and `max_val_tokens` (default 200,000): files stop
  being read once both splits are full.

Documents are joined with the tokenizer's end-of-sequence token (none for `bytes`). A training
step samples `batch_size` windows of `seq_len + 1` tokens at offsets drawn from a generator seeded
by (seed, step); validation batches are windows at fixed, evenly spaced offsets, so held-out text
is never seen in training. The provenance records the corpus, the tokenizer (and the sha256 of
its files), the token counts and the sha256 of the train and validation token streams.
"""

from __future__ import annotations

import glob
import hashlib
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from freezeopt.errors import InputError, short
from freezeopt.hf import INSTALL_HINT, require_transformers
from freezeopt.hf.source import file_sha256, locate
from freezeopt.torchpp.job import DataParts

__all__ = ["Tokenizer", "corpus_files", "load_tokenizer", "text_corpus"]


class Tokenizer:
    """What the corpus needs of a tokenizer: encode documents, the separator, an identity."""

    def __init__(
        self,
        encode: Callable[[list[str]], list[list[int]]],
        eos: int | None,
        vocab_size: int,
        identity: dict[str, Any],
    ) -> None:
        self.encode, self.eos, self.vocab_size, self.identity = encode, eos, vocab_size, identity


def _bytes_tokenizer() -> Tokenizer:
    return Tokenizer(
        lambda docs: [list(d.encode("utf-8")) for d in docs], None, 256, {"kind": "bytes"}
    )


def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer `spec` names (see the module docstring), from local files only."""
    if spec == "bytes":
        return _bytes_tokenizer()
    if spec.startswith("pkg:") or spec.lower().endswith(".gguf"):
        src = locate(spec)
        d = src.tokenizer_dir()
        if d is None:
            raise InputError(f"tokenizer {spec}: holds no tokenizer files; name a tokenizer")
        return _from_folder(spec, d)
    p = Path(spec).expanduser()
    if not p.exists():
        raise InputError(
            f"tokenizer {spec}: no such file or folder; give a tokenizer folder, a tokenizer.json, "
            "a .gguf file or `bytes`"
        )
    if p.is_file() and p.suffix == ".json":
        try:
            from tokenizers import Tokenizer as Fast
        except ImportError:
            raise InputError(
                f"a tokenizer.json needs the tokenizers package: {INSTALL_HINT}"
            ) from None
        try:
            fast = Fast.from_file(str(p))
        except Exception as e:  # the Rust library raises its own exception type
            raise InputError(f"tokenizer {spec}: cannot read it ({short(e, 120)})") from None
        eos = next(
            (
                fast.token_to_id(t)
                for t in ("</s>", "<|endoftext|>", "<|im_end|>", "<eos>")
                if fast.token_to_id(t) is not None
            ),
            None,
        )
        return Tokenizer(
            lambda docs: [e.ids for e in fast.encode_batch(docs, add_special_tokens=False)],
            eos,
            fast.get_vocab_size(),
            {"kind": "tokenizer.json", "path": str(p), "sha256": file_sha256(p)},
        )
    if p.is_dir():
        return _from_folder(spec, p)
    raise InputError(
        f"tokenizer {spec}: expected a tokenizer folder, a tokenizer.json, a .gguf file or `bytes`"
    )


def _from_folder(spec: str, d: Path) -> Tokenizer:
    transformers = require_transformers()
    try:
        tok = transformers.AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise InputError(
            f"tokenizer {spec}: transformers cannot load the tokenizer in {d} ({short(e, 120)})"
        ) from None
    files = sorted(f for f in d.iterdir() if f.name.startswith(("tokenizer", "vocab", "merges")))
    h = hashlib.sha256()
    for f in files:
        if f.is_file():
            h.update(f.name.encode() + b"\0" + file_sha256(f).encode())

    def encode(docs: list[str]) -> list[list[int]]:
        return [list(ids) for ids in tok(docs, add_special_tokens=False)["input_ids"]]

    return Tokenizer(
        encode,
        tok.eos_token_id,
        len(tok),
        {"kind": type(tok).__name__, "source": spec, "files_sha256": h.hexdigest()},
    )


def corpus_files(root: Path, patterns: Sequence[str]) -> list[Path]:
    """Files under `root` matching any of `patterns`, sorted by relative path, no duplicates."""
    found: set[Path] = set()
    for pat in patterns:
        for m in glob.glob(pat, root_dir=root, recursive=True):
            f = root / m
            if f.is_file():
                found.add(f)
    return sorted(found, key=lambda f: f.relative_to(root).as_posix())


def text_corpus(
    *,
    batch_size: int,
    seq_len: int,
    seed: int,
    root: str | None = None,
    files: Sequence[str] = ("**/*.txt",),
    tokenizer: str | None = None,
    tokenizer_of_model: bool = False,
    val_every: int = 10,
    max_train_tokens: int = 2_000_000,
    max_val_tokens: int = 200_000,
) -> DataParts:
    """Tokenized local text (see the module docstring)."""
    if root is None:
        raise InputError("hf-text: set data_args.root to the corpus folder (or `stdlib`)")
    if isinstance(files, str) or not files or not all(isinstance(f, str) and f for f in files):
        raise InputError("hf-text: data_args.files is a list of glob patterns, e.g. ['**/*.txt']")
    if val_every < 2:
        raise InputError(
            "hf-text: val_every must be at least 2 (every val_every-th file is held out)"
        )
    if min(max_train_tokens, max_val_tokens) <= seq_len + 1:
        raise InputError(
            f"hf-text: max_train_tokens and max_val_tokens must exceed seq_len + 1 ({seq_len + 1})"
        )
    if tokenizer is None:
        raise InputError(
            "hf-text: the model has no tokenizer (random init from an architecture); set "
            "data_args.tokenizer to `bytes`, a tokenizer folder or a tokenizer.json"
            if tokenizer_of_model
            else "hf-text: set data_args.tokenizer (a tokenizer folder, tokenizer.json, .gguf or `bytes`)"
        )
    if tokenizer_of_model and not tokenizer.startswith("pkg:") and not tokenizer.endswith(".gguf"):
        src = locate(tokenizer)
        d = src.tokenizer_dir()
        if d is None:
            raise InputError(
                f"hf-text: model hf:{tokenizer} has no tokenizer files; set data_args.tokenizer "
                "(`bytes`, a tokenizer folder or a tokenizer.json)"
            )
        tokenizer = str(d)
    base = Path(sysconfig.get_paths()["stdlib"]) if root == "stdlib" else Path(root).expanduser()
    if not base.is_dir():
        raise InputError(f"hf-text: corpus folder {root} does not exist; set data_args.root")
    paths = corpus_files(base, files)
    if not paths:
        raise InputError(
            f"hf-text: no file under {root} matches {', '.join(files)}; fix data_args.files"
        )
    tok = load_tokenizer(tokenizer)
    sep = [] if tok.eos is None else [tok.eos]
    by_file = len(paths) >= val_every
    train_ids: list[int] = []
    val_ids: list[int] = []
    text_hash = hashlib.sha256()
    n_read = n_bytes = 0
    for i, f in enumerate(paths):
        is_val = by_file and i % val_every == val_every - 1
        if len(train_ids) >= max_train_tokens and (not by_file or len(val_ids) >= max_val_tokens):
            break
        if len(val_ids if is_val else train_ids) >= (
            max_val_tokens if is_val else max_train_tokens
        ):
            continue
        raw = f.read_bytes()
        text_hash.update(f.relative_to(base).as_posix().encode() + b"\0" + raw + b"\0")
        n_read += 1
        n_bytes += len(raw)
        ids = tok.encode([raw.decode("utf-8", errors="replace")])[0] + sep
        (val_ids if is_val else train_ids).extend(ids)
    if not by_file:  # too few files to hold whole ones out: the stream's tail is held out
        cut = len(train_ids) - max(seq_len + 2, len(train_ids) // val_every)
        train_ids, val_ids = train_ids[:cut], train_ids[cut:]
    train_ids, val_ids = train_ids[:max_train_tokens], val_ids[:max_val_tokens]
    if len(train_ids) <= seq_len + 1 or len(val_ids) <= seq_len + 1:
        raise InputError(
            f"hf-text: the corpus gives {len(train_ids)} training and {len(val_ids)} validation "
            f"tokens, too few for seq_len {seq_len}; add files or lower seq_len"
        )
    train_t = torch.tensor(train_ids, dtype=torch.long)
    val_t = torch.tensor(val_ids, dtype=torch.long)

    def windows(data: torch.Tensor, offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = data[offsets[:, None] + torch.arange(seq_len + 1)[None, :]]
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def train_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        hi = len(train_t) - seq_len - 1
        return windows(train_t, torch.randint(0, hi, (batch_size,), generator=g))

    n_windows = len(val_t) - seq_len - 1

    def val_batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        stride = max(1, n_windows // max(1, batch_size * 64))
        start = (i * batch_size * stride) % max(1, n_windows - batch_size * stride)
        offs = (torch.arange(batch_size) * stride + start).clamp(max=n_windows - 1)
        return windows(val_t, offs)

    def digest(t: torch.Tensor) -> str:
        return hashlib.sha256(t.numpy().astype("<i8").tobytes()).hexdigest()

    return DataParts(
        train=train_batch,
        val=val_batch,
        provenance={
            "corpus": "hf-text",
            "root": str(root),
            "files": list(files),
            "files_read": n_read,
            "bytes_read": n_bytes,
            "text_sha256": text_hash.hexdigest(),
            "split": f"every {val_every}th file"
            if by_file
            else f"last 1/{val_every} of the tokens",
            "tokenizer": tok.identity,
            "vocab_size": tok.vocab_size,
            "train_tokens": len(train_ids),
            "val_tokens": len(val_ids),
            "train_sha256": digest(train_t),
            "val_sha256": digest(val_t),
        },
    )
