"""`data: hf-text`: local text tokenized with the model's tokenizer, a held-out split, hashes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="needs the freezeopt[hf] extra (make test installs it)")

from freezeopt.errors import InputError
from freezeopt.hf.data import load_tokenizer, text_corpus
from freezeopt.torchpp.job import parse_job, resolve_data


def corpus(root: Path, n: int = 10) -> Path:
    """`n` files; the 10th (sorted) is the held-out one and holds only 'z'."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        ch = "z" if i % 10 == 9 else "ab"
        (root / f"f{i:02d}.txt").write_text(ch * 300)
    (root / "skip.md").write_text("not matched")
    return root


def test_files_are_held_out_whole_and_hashed(tmp_path: Path) -> None:
    root = corpus(tmp_path / "c")
    d = text_corpus(batch_size=4, seq_len=16, seed=0, root=str(root), tokenizer="bytes")
    x, y = d.train(0)
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1])
    assert set(x.unique().tolist()) <= {ord("a"), ord("b")}
    vx, _ = d.val(0)
    assert set(vx.unique().tolist()) == {ord("z")}  # never seen in training
    p = d.provenance
    assert p["files_read"] == 10 and p["split"] == "every 10th file"
    assert p["train_tokens"] == 9 * 600 and p["val_tokens"] == 300
    again = text_corpus(batch_size=4, seq_len=16, seed=0, root=str(root), tokenizer="bytes")
    assert torch.equal(again.train(3)[0], d.train(3)[0])
    assert again.provenance == p
    (root / "f00.txt").write_text("ba" * 300)  # same tokens count, other text: other hashes
    other = text_corpus(batch_size=4, seq_len=16, seed=0, root=str(root), tokenizer="bytes")
    assert other.provenance["train_sha256"] != p["train_sha256"]
    assert other.provenance["val_sha256"] == p["val_sha256"]


def test_a_small_corpus_holds_out_its_tail(tmp_path: Path) -> None:
    root = corpus(tmp_path / "c", n=3)
    d = text_corpus(batch_size=2, seq_len=8, seed=1, root=str(root), tokenizer="bytes")
    assert d.provenance["split"] == "last 1/10 of the tokens"
    assert d.provenance["train_tokens"] + d.provenance["val_tokens"] == 3 * 600


def test_the_models_tokenizer_is_the_default(tmp_path: Path) -> None:
    """A folder written by save_pretrained holds the model and its tokenizer: hf-text with an
    `hf:` model and no `tokenizer` uses that one."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = tmp_path / "c"
    root.mkdir()
    for i in range(10):
        (root / f"f{i}.txt").write_text(" ".join(f"w{(i * 7 + j) % 40}" for j in range(200)))
    fast = Tokenizer(models.BPE(unk_token="<unk>"))
    fast.pre_tokenizer = pre_tokenizers.Whitespace()
    fast.train(
        [str(p) for p in sorted(root.glob("*.txt"))],
        trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>", "</s>"]),
    )
    fast.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.eos == fast.token_to_id("</s>") and tok.identity["kind"] == "tokenizer.json"
    folder = tmp_path / "m"
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    LlamaForCausalLM(cfg).save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=fast, eos_token="</s>").save_pretrained(folder)
    job = parse_job(
        {"name": "t", "model": "hf:m", "data": "hf-text", "data_args": {"root": "c"}},
        base_dir=tmp_path,
    )
    assert job.model == f"hf:{folder}" and job.data_args["root"] == str(root)
    d = resolve_data(job)(batch_size=2, seq_len=8, seed=0, **job.data_args)
    assert d.provenance["tokenizer"]["source"] == str(folder)
    assert d.provenance["vocab_size"] == fast.get_vocab_size()
    x, _ = d.train(0)
    assert int(x.max()) < fast.get_vocab_size()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ({}, "set data_args.root"),
        ({"root": "nowhere"}, "corpus folder nowhere does not exist"),
        ({"root": "c", "files": ["*.rst"]}, "no file under c matches *.rst"),
        ({"root": "c", "files": "*.txt"}, "data_args.files is a list of glob patterns"),
        ({"root": "c", "tokenizer": "nope.json"}, "tokenizer nope.json: no such file or folder"),
        ({"root": "c", "val_every": 1}, "val_every must be at least 2"),
    ],
)
def test_bad_data_args_fail_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: dict[str, object], says: str
) -> None:
    corpus(tmp_path / "c")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=None) as e:
        text_corpus(batch_size=2, seq_len=8, seed=0, **{"tokenizer": "bytes", **args})  # type: ignore[arg-type]
    assert says in str(e.value) and "\n" not in str(e.value)


def test_a_random_init_model_needs_a_tokenizer_named(tmp_path: Path) -> None:
    job = parse_job(
        {"name": "t", "model": "hf:llama", "data": "hf-text", "data_args": {"root": "stdlib"}}
    )
    with pytest.raises(InputError, match=r"set data_args\.tokenizer"):
        resolve_data(job)(batch_size=2, seq_len=8, seed=0, **job.data_args)
