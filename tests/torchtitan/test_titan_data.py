"""The offline tokenizer and dataset a torchtitan job reads.

(This folder has no `__init__.py` and its modules are named `test_titan_*`: as a package it would
be importable as `torchtitan` and hide the real one.)"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "torchtitan", reason="needs the freezeopt[torchtitan] extra (make test installs it)"
)

from freezeopt.torchtitan.data import register_docs, write_tokenizer


def test_the_tokenizer_maps_bytes_to_themselves_and_is_byte_identical(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    a, b = write_tokenizer(tmp_path / "a"), write_tokenizer(tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    tok = Tokenizer.from_file(str(a / "tokenizer.json"))
    text = "déjà vu\n\t\x00 ✓"
    assert tok.encode(text).ids == list(text.encode())
    assert tok.get_vocab_size() == 258
    assert tok.encode("<|end_of_text|>").ids == [257]


def test_torchtitan_builds_its_tokenizer_and_reads_the_docs_corpus(tmp_path: Path) -> None:
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets.text_datasets import DATASETS

    tok = HuggingFaceTokenizer(str(write_tokenizer(tmp_path)))
    ids = tok.encode("abc", add_bos=True, add_eos=True)
    assert ids == [256, 97, 98, 99, 257]
    register_docs()
    train = DATASETS["freezeopt-docs"].loader("freezeopt-docs")
    val = DATASETS["freezeopt-docs-val"].loader("freezeopt-docs-val")
    texts = {r["text"] for r in train}
    from pydoc_data.topics import topics

    assert (len(train), len(val)) == (len(topics) - len(topics) // 4, len(topics) // 4)
    assert not texts & {r["text"] for r in val}  # held out: no topic in both
    assert DATASETS["freezeopt-docs"].sample_processor(train[0]) == train[0]["text"]
