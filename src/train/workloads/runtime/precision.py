"""Mixed precision: bf16 on compute capability >= 8 (the rule is train.common.gpus', which
submission uses too), fp16 with a GradScaler below, fp32 on CPU; mask fill values come from
the dtype, since -1e9 overflows fp16 (lowest finite value -65504)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from train.common.errors import ConfigError
from train.common.gpus import BF16_MIN_CAPABILITY, bf16_capable

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str  # bf16, fp16 or fp32
    device_type: str  # cpu or cuda

    @property
    def dtype(self) -> torch.dtype:
        return _DTYPES[self.name]

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def make_scaler(self) -> torch.amp.GradScaler | None:
        """A GradScaler for fp16 only: bf16 has fp32's exponent range and needs none."""
        if self.name != "fp16":
            return None
        return torch.amp.GradScaler(self.device_type)


def select_precision(requested: str, device_type: str,
                     capability: tuple[int, int] | None = None,
                     device_name: str = "") -> PrecisionPolicy:
    """Pure rule: requested precision (auto, bf16, fp16 or fp32: RunConfig's choices) +
    device -> policy; impossible requests are errors."""
    if device_type != "cuda":
        # fp16/bf16 on CPU work (CPU autocast) but are slow; they exist to test those paths.
        return PrecisionPolicy("fp32" if requested == "auto" else requested, device_type)
    bf16 = bf16_capable(capability)
    if requested == "auto":
        return PrecisionPolicy("bf16" if bf16 else "fp16", device_type)
    if requested == "bf16" and not bf16:
        cap = f"{capability[0]}.{capability[1]}" if capability else "unknown"
        need = ".".join(map(str, BF16_MIN_CAPABILITY))
        raise ConfigError("precision", f"bf16 needs compute capability >= {need} (A100, "
                          f"A30, A10, L40S, H100, H200); {device_name or 'this GPU'} has "
                          f"{cap}. Use fp16 or auto.")
    return PrecisionPolicy(requested, device_type)


def resolve_precision(requested: str, device: torch.device) -> PrecisionPolicy:
    if device.type == "cuda":
        return select_precision(requested, "cuda", torch.cuda.get_device_capability(device),
                                torch.cuda.get_device_name(device))
    return select_precision(requested, device.type)


def mask_fill_value(dtype: torch.dtype) -> float:
    """-1e9, or in fp16 a quarter of the lowest finite value, so that sums, scaling by a
    discount and max() never reach -inf."""
    return -min(1e9, torch.finfo(dtype).max / 4)


def masked_fill_unavailable(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return q.masked_fill(~mask, mask_fill_value(q.dtype))
