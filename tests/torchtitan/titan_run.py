"""Run by tests/torchtitan/test_titan_trainer.py under torchrun: freezeopt's torchtitan entry point with
a trainer that also saves every parameter's reduced gradient after step 1's backward (before
torchtitan clips and steps), gathered whole from the FSDP2 shards, to
`<dump_folder>/grads.<pp rank>.pt`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from freezeopt.torchtitan.__main__ import main


def dump_trainer() -> type:
    import torch
    import torch.distributed as dist

    from freezeopt.torchtitan.trainer import FreezeTrainer

    class DumpTrainer(FreezeTrainer):
        def forward_backward_step(self, **kwargs: Any) -> Any:
            loss = super().forward_backward_step(**kwargs)
            if self.step == 1:
                grads = {}
                for part in self.model_parts:
                    for name, p in part.named_parameters():
                        g = p.grad
                        whole = getattr(g, "full_tensor", None)  # an FSDP2 shard's DTensor
                        grads[name] = None if g is None else (whole() if whole else g).clone()
                pd = self.parallel_dims
                if not pd.dp_enabled or pd.get_mesh("batch").get_local_rank() == 0:
                    out = Path(self.job_config.job.dump_folder)
                    out.mkdir(parents=True, exist_ok=True)
                    torch.save(grads, out / f"grads.{pd.get_mesh('pp').get_local_rank()}.pt")
                dist.barrier()
            return loss

    return DumpTrainer


if __name__ == "__main__":
    main(dump_trainer)
