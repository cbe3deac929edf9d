"""Hugging Face causal language models as freezeopt jobs (the optional `freezeopt[hf]` extra).

Why a package of its own: it is profiling input, like `freezeopt.examples` — a job spec names it
(`model: hf:<source>`, `data: hf-text`) and `freezeopt.torchpp.job` looks the functions up by
name, so nothing on the default paths imports it, and it imports `transformers` only inside the
functions that need it (`import freezeopt`, the runtime hook and the job spec stay free of it).

* `source`: where a model comes from — an architecture name (random init from a config), a
  `config.json`, a folder (`config.json` plus `*.safetensors` weights), a GGUF file (converted
  once through transformers' GGUF loader into a cached safetensors folder), or a file inside an
  installed package (`pkg:<package>/<path>`); no hub, nothing fetched at run time;
* `model`: `build_model` splits the model into pipeline stages by decoder layers and returns
  `freezeopt.torchpp.job.ModelParts` with one parameter group per decoder layer and, for tied
  input/output embeddings, the tie that the pipeline keeps in sync across stages;
* `data`: `text_corpus` tokenizes local text files with the model's tokenizer, holds out a
  validation split and records the hashes of both.

`docs/profiling.md` ("Hugging Face models") documents the job fields.
"""

from __future__ import annotations

from types import ModuleType

from freezeopt.errors import InputError

__all__ = ["INSTALL_HINT", "require_transformers"]

INSTALL_HINT = "install freezeopt[hf] (pip install 'freezeopt[hf]')"
"""The one line said when the extra is missing."""


def require_transformers() -> ModuleType:
    """`transformers`, imported now; InputError with `INSTALL_HINT` when it is not installed."""
    import os

    # nothing is fetched at run time: every load below reads local files only
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers
    except ImportError:
        raise InputError(f"this job needs Hugging Face transformers: {INSTALL_HINT}") from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers
