"""Hugging Face models split into stages: the stage chain computes the unsplit model's logits, the
groups and split follow `model_args`, tied embeddings are copied and recorded, weights load from
a safetensors folder and a GGUF file (both written here), and bad specs fail in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="needs the freezeopt[hf] extra (make test installs it)")

from typer.testing import CliRunner

from freezeopt.cli import app
from freezeopt.errors import InputError
from freezeopt.hf import require_transformers
from freezeopt.hf.model import build_model, load_config
from freezeopt.hf.source import gguf_folder, locate
from freezeopt.torchpp.job import parse_job
from freezeopt.torchpp.pipeline import RankPipeline, plan_pipeline, preflight_model

TINY: dict[str, dict[str, Any]] = {
    "llama": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3},
    "qwen2": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3},
    "gpt2": {"n_embd": 32, "n_layer": 3},
}


def full_model(arch: str, config: dict[str, Any]) -> Any:
    """The unsplit transformers model, built as `build_model` builds it (same seed, no dropout)."""
    tr = require_transformers()
    torch.manual_seed(0)
    cfg = load_config(locate(arch), config)
    for f in ("attention_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"):
        if hasattr(cfg, f):
            setattr(cfg, f, 0.0)
    cfg._attn_implementation = "sdpa"
    return tr.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_stages_compute_the_unsplit_models_logits(arch: str) -> None:
    torch.manual_seed(0)
    parts = build_model(source=arch, n_stages=2, seq_len=16, config=TINY[arch])
    full = full_model(arch, TINY[arch])
    x = torch.randint(0, 256, (2, 16))
    h = x
    for st in parts.stages:
        h = st.eval()(h)
    assert torch.equal(h, full(x).logits)
    # transformers' own parameter names, split between the stages
    names = [n for st in parts.stages for n, _ in st.named_parameters()]
    ref = [n for n, _ in full.named_parameters()]
    if arch == "gpt2":  # tied: the last stage holds its own copy of the shared weight
        ref.append("lm_head.weight")
    assert sorted(names) == sorted(ref)
    # one group per decoder layer; embeddings and head in groups of their own
    assert parts.groups is not None
    assert [list(g) for g in parts.groups] == [
        ["embed", "layers.0", "layers.1"],
        ["layers.2", "head"],
    ]
    key = "h" if arch == "gpt2" else "layers"
    assert all(f".{key}.2." in n for n in parts.groups[1]["layers.2"])
    assert parts.groups[1]["head"][-1] == "lm_head.weight"


def test_tied_embeddings_are_copied_and_recorded() -> None:
    torch.manual_seed(0)
    parts = build_model(source="gpt2", n_stages=2, seq_len=16, config=TINY["gpt2"])
    wte = dict(parts.stages[0].named_parameters())["transformer.wte.weight"]
    head = dict(parts.stages[1].named_parameters())["lm_head.weight"]
    assert torch.equal(wte, head) and wte.data_ptr() != head.data_ptr()
    assert list(parts.tied) == [((0, "transformer.wte.weight"), (1, "lm_head.weight"))]
    untied = build_model(source="gpt2", n_stages=2, seq_len=16, config=TINY["gpt2"], tie="untie")
    assert list(untied.tied) == []
    one = build_model(source="gpt2", n_stages=1, seq_len=16, config=TINY["gpt2"])
    assert list(one.tied) == []  # one stage keeps the one shared parameter
    assert "lm_head.weight" not in dict(one.stages[0].named_parameters())
    assert (
        list(build_model(source="llama", n_stages=2, seq_len=16, config=TINY["llama"]).tied) == []
    )


def test_sync_sums_the_copies_gradients_and_keeps_none_where_all_are_none() -> None:
    """Two copies on one rank (a V schedule's first and last stage): no process group."""
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(3))
    rp = RankPipeline.__new__(RankPipeline)
    rp.ties = [([a, b], None)]
    a.grad, b.grad = torch.tensor([1.0, 2.0, 3.0]), None  # b's group frozen in every microbatch
    rp.sync_tied_grads()
    assert torch.equal(a.grad, b.grad) and torch.equal(b.grad, torch.tensor([1.0, 2.0, 3.0]))
    a.grad, b.grad = torch.ones(3), torch.full((3,), 2.0)
    rp.sync_tied_grads()
    assert torch.equal(a.grad, torch.full((3,), 3.0)) and torch.equal(b.grad, a.grad)
    assert a.grad.data_ptr() != b.grad.data_ptr()
    a.grad = b.grad = None
    rp.sync_tied_grads()
    assert a.grad is None and b.grad is None


def test_split_groups_and_ends_follow_model_args() -> None:
    cfg = {**TINY["llama"], "num_hidden_layers": 5}
    parts = build_model(source="llama", n_stages=2, seq_len=16, config=cfg)
    assert [len(st.model.layers) for st in parts.stages] == [3, 2]  # even, first takes the rest
    parts = build_model(
        source="llama", n_stages=2, seq_len=16, config=cfg, split=[1, 4], groups_of=2, ends="join"
    )
    assert parts.groups is not None
    assert [list(g) for g in parts.groups] == [["layers.0"], ["layers.1-2", "layers.3-4"]]
    assert parts.groups[0]["layers.0"][0] == "model.embed_tokens.weight"
    assert parts.groups[1]["layers.3-4"][-2:] == ["model.norm.weight", "lm_head.weight"]
    kept = build_model(source="llama", n_stages=2, seq_len=16, config=cfg, layers=2)
    assert [list(st.model.layers) for st in kept.stages] == [["0"], ["1"]]


def test_job_groups_patterns_override_the_defaults() -> None:
    job = parse_job(
        {
            "name": "hf-groups",
            "model": "hf:llama",
            "model_args": {"config": {**TINY["llama"], "num_hidden_layers": 4}},
            "data": "hf-text",
            "data_args": {"root": "stdlib", "tokenizer": "bytes"},
            "groups": {"attn": ["*self_attn*"], "rest": ["*"]},
        }
    )
    # "rest" matches everything, so make it disjoint from attn the way users do: no overlap allowed
    with pytest.raises(InputError, match="matches groups 'attn' and 'rest'"):
        preflight_model(job, plan_pipeline(job))
    job = parse_job(
        {
            **job.to_dict(),
            "groups": {
                "attn": ["*self_attn*"],
                "mlp": ["*mlp*"],
                "ends": ["*norm*", "*embed*", "lm_head*"],
            },
        }
    )
    got = preflight_model(job, plan_pipeline(job))
    assert got is not None
    assert [[g for g, _ in got.groups[s]] for s in (0, 1)] == [
        ["ends", "attn", "mlp"],
        ["attn", "mlp", "ends"],
    ]


def test_safetensors_folder_and_config_file(tmp_path: Path) -> None:
    full = full_model("llama", TINY["llama"])
    full.save_pretrained(tmp_path / "m")
    assert any((tmp_path / "m").glob("*.safetensors"))
    torch.manual_seed(123)  # another seed: the weights must come from the files
    parts = build_model(source=str(tmp_path / "m"), n_stages=2, seq_len=16)
    got = {n: p for st in parts.stages for n, p in st.named_parameters()}
    for n, p in full.named_parameters():
        assert torch.equal(got[n], p), n
    rand = build_model(source=str(tmp_path / "m"), n_stages=2, seq_len=16, init="random")
    w = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(dict(rand.stages[0].named_parameters())[w], got[w])
    cfg_only = build_model(source=str(tmp_path / "m" / "config.json"), n_stages=2, seq_len=16)
    assert dict(cfg_only.stages[0].named_parameters())[w].shape == got[w].shape
    with pytest.raises(InputError, match="init is pretrained but the source has no weights"):
        build_model(
            source=str(tmp_path / "m" / "config.json"), n_stages=2, seq_len=16, init="pretrained"
        )


def write_tiny_gguf(path: Path) -> dict[str, torch.Tensor]:
    """A 2-layer Llama with tied embeddings as a float32 GGUF file, laid out as llama.cpp writes
    one (q/k rows permuted, byte-level tokenizer); returns the original weights."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tr = require_transformers()
    heads, kv, d, layers = 4, 2, 32, 2
    cfg = tr.LlamaConfig(
        vocab_size=260,
        hidden_size=d,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(0)
    sd = tr.AutoModelForCausalLM.from_config(cfg).state_dict()

    def permute(w: Any, n: int) -> Any:
        return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(128)
    w.add_embedding_length(d)
    w.add_block_count(layers)
    w.add_feed_forward_length(64)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(d // heads)
    b2u = bytes_to_unicode()
    w.add_tokenizer_model("gpt2")
    w.add_token_list([b2u[i] for i in range(256)] + ["<s>", "</s>", "<unk>", "<pad>"])
    w.add_token_types([1] * 256 + [3] * 4)
    w.add_token_scores([0.0] * 260)
    w.add_token_merges([])
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
    }
    for i in range(layers):
        for hf, g in [
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
            ("self_attn.q_proj", "attn_q"),
            ("self_attn.k_proj", "attn_k"),
            ("self_attn.v_proj", "attn_v"),
            ("self_attn.o_proj", "attn_output"),
            ("mlp.gate_proj", "ffn_gate"),
            ("mlp.up_proj", "ffn_up"),
            ("mlp.down_proj", "ffn_down"),
        ]:
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{g}.weight"
    for hf, g in names.items():
        t = sd[hf].numpy()
        if ".attn_q." in g:
            t = permute(t, heads)
        elif ".attn_k." in g:
            t = permute(t, kv)
        w.add_tensor(g, t)  # no output.weight: llama.cpp's way of saying "tied"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: v for k, v in sd.items() if k in names}


def test_gguf_file_loads_once_into_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from freezeopt.hf.data import load_tokenizer

    monkeypatch.setenv("FREEZEOPT_CACHE", str(tmp_path / "cache"))
    want = write_tiny_gguf(tmp_path / "tiny.gguf")
    parts = build_model(source=str(tmp_path / "tiny.gguf"), n_stages=2, seq_len=16)
    got = {n: p for st in parts.stages for n, p in st.named_parameters()}
    for n, t in want.items():
        assert torch.equal(got[n], t), n
    assert torch.equal(got["lm_head.weight"], want["model.embed_tokens.weight"])
    assert list(parts.tied) == [((0, "model.embed_tokens.weight"), (1, "lm_head.weight"))]
    (folder,) = (tmp_path / "cache" / "hf").iterdir()
    assert json.loads((folder / "freezeopt-source.json").read_text())["gguf"] == str(
        tmp_path / "tiny.gguf"
    )
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert gguf_folder(tmp_path / "tiny.gguf") == folder  # converted once
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    tok = load_tokenizer(str(tmp_path / "tiny.gguf"))
    assert tok.eos == 257 and tok.encode(["hi"]) == [[104, 105]]


# --- one clear line for a bad spec -------------------------------------------------------------


def run_profile(tmp_path: Path, **job: Any) -> Any:
    spec = {
        "name": "bad",
        "data": "hf-text",
        "data_args": {"root": "stdlib", "tokenizer": "bytes"},
        **job,
    }
    (tmp_path / "job.yaml").write_text(json.dumps(spec))
    return CliRunner().invoke(
        app, ["profile", str(tmp_path / "job.yaml"), "-o", str(tmp_path / "p.json")]
    )


@pytest.mark.parametrize(
    ("job", "says"),
    [
        ({"model": "hf:no/such/folder"}, "model hf:no/such/folder: no such file or folder"),
        (
            {"model": "hf:bert.json"},
            "unknown architecture 'bert'; freezeopt splits llama, qwen2, gpt2",
        ),
        (
            {"model": "hf:llama", "model_args": {"split": [3, 1]}},
            "hf model_args.split [3, 1] does not fit",
        ),
        ({"model": "hf:llama", "model_args": {"split": "2,1"}}, "hf model_args.split is 2,1"),
        (
            {"model": "hf:llama", "model_args": {"layrs": 2}},
            "hf model_args has unknown field(s) layrs",
        ),
        ({"model": "hf:gpt2", "seq_len": 4096}, "exceeds the model's max_position_embeddings 1024"),
        ({"model": "hf:"}, "model hf: names no source"),
        ({"model": "hf:pkg:no_such_pkg_here/x.gguf"}, "package no_such_pkg_here is not installed"),
    ],
)
def test_a_bad_spec_fails_in_one_line(tmp_path: Path, job: dict[str, Any], says: str) -> None:
    (tmp_path / "bert.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    r = run_profile(tmp_path, **job)
    assert r.exit_code == 2, r.output
    assert len(r.stderr.splitlines()) == 1 and says in r.stderr, r.stderr
    assert not (tmp_path / "p.json").exists()


def test_missing_extra_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)  # import fails
    r = run_profile(tmp_path, model="hf:llama")
    assert r.exit_code == 2
    assert r.stderr.strip().endswith("install freezeopt[hf] (pip install 'freezeopt[hf]')")
    assert len(r.stderr.splitlines()) == 1
