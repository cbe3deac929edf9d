"""Running torchtitan on a machine without an accelerator.

torchtitan 0.2.2 picks its device at import time (`torchtitan.tools.utils.device_type`, "cuda"
when torch finds no accelerator) and several of its modules copy that name and `torch.cuda` at
their own import. On such a machine `use_cpu` points every loaded torchtitan module at the CPU:
`device_type` becomes "cpu" and `device_module` a small stand-in for `torch.cuda` whose device
calls (set_device, synchronize, the memory statistics torchtitan logs) do nothing or report
zero. Nothing else changes: torchtitan builds its gloo process groups, its meshes, FSDP2 and its
pipeline as it would anywhere. Call it after importing `torchtitan.train` and before building a
trainer; on a machine with an accelerator it does nothing.

One collective needs a change after the model is built: torchtitan normalises gradients by the
global token count itself and turns FSDP2's division off (divide factor 1), which FSDP2 performs
as a pre-multiplied sum, a reduction NCCL has and gloo has not. `sum_reductions` has FSDP2 reduce
with a plain sum and scale separately (`set_force_sum_reduction_for_comms`): the same gradients.
"""

from __future__ import annotations

import collections
import os
import sys
from typing import Any

__all__ = ["CpuDevice", "sum_reductions", "use_cpu"]


class _Properties:
    name = "cpu"
    total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class CpuDevice:
    """What torchtitan calls on its `device_module`, answered for the CPU."""

    def __getattr__(self, name: str) -> Any:
        import torch

        return getattr(torch.cpu, name)

    def set_device(self, device: Any) -> None:
        pass

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return 1

    def get_device_name(self, device: Any = None) -> str:
        return "cpu"

    def get_device_properties(self, device: Any = None) -> _Properties:
        return _Properties()

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def memory_stats(self, device: Any = None) -> dict[str, int]:
        return collections.defaultdict(int)

    def synchronize(self, device: Any = None) -> None:
        pass


def use_cpu() -> bool:
    """Point the loaded torchtitan modules at the CPU unless torch has an accelerator; return
    whether it did."""
    import torch

    if torch.accelerator.is_available():
        return False
    stand_in = CpuDevice()
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "torchtitan" or name.startswith("torchtitan.")):
            continue
        if getattr(mod, "device_type", None) == "cuda":
            setattr(mod, "device_type", "cpu")  # noqa: B010 - a module's global, by name
        if getattr(mod, "device_module", None) is torch.cuda:
            setattr(mod, "device_module", stand_in)  # noqa: B010
    return True


def sum_reductions(model_parts: Any) -> int:
    """Have every FSDP2 module of `model_parts` reduce gradients with plain sums (gloo has no
    pre-multiplied sum); return how many modules it set."""
    from torch.distributed.fsdp import FSDPModule

    n = 0
    for part in model_parts:
        for m in part.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
                n += 1
    return n
