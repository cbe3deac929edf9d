"""Built-in example jobs for `freezeopt profile`: a tiny byte-level GPT on the Python standard library.

`tiny-gpt.yaml` (next to this file) is the built-in job spec, `tiny-gpt-docs.yaml` fine-tunes its
trained model on English prose and `smollm2.yaml` fine-tunes a pretrained LLM; `tiny_gpt` holds the
tiny GPT's model and data functions, which double as a worked example of the `module:function`
contract in `freezeopt.torchpp.job`.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["EXAMPLES_DIR", "builtin_job_path"]

EXAMPLES_DIR = Path(__file__).resolve().parent


def builtin_job_path(name: str) -> Path | None:
    """The packaged job spec called `name` (e.g. `tiny-gpt`), or None when there is none."""
    p = EXAMPLES_DIR / f"{name}.yaml"
    return p if p.is_file() else None
