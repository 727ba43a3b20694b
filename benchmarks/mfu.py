"""MFU for bench_gpu.py: model FLOPs utilisation, the FLOP/s a training row achieves over its device's peak dense
bf16 FLOP/s. The peak comes from a table of known devices (or ``--peak-tflops``); a decoder's FLOPs per token are
counted from its shape (``decoder_flops``); an encoder's are the child's own 6N (train_common.py).

The FLOPs count the model's matrix products, not attention's scores nor a recompute; a LoRA step counts ~4N (the
forward and the activations' gradients through the frozen weights) plus 6 x the adapters' parameters."""

from __future__ import annotations

from typing import Any

from harness import Result

# dense bf16 peak FLOP/s (no sparsity) by a substring of torch.cuda.get_device_name(); the first match wins
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100 SXM": 989.0, "H100 PCIe": 756.0, "H100": 756.0, "A100": 312.0,
                    "L40S": 362.0, "L4": 121.0, "A10G": 70.0, "A10": 125.0, "RTX 4090": 165.0, "RTX 3090": 71.0}


def peak_tflops(device_name: str, given: float | None) -> float | None:
    """``given`` (``--peak-tflops``), else the table's figure for ``device_name``; None for a device it lacks."""
    if given:
        return given
    return next((tflops for key, tflops in PEAK_BF16_TFLOPS.items() if key in device_name), None)


def with_mfu(result: Result, tflops: float | None) -> Result:
    """``result`` with its ``mfu`` where both its GFLOP/s and the device's peak are known."""
    if "gflops" in result and tflops:
        result["mfu"] = result["gflops"] / (tflops * 1e3)
    return result


def decoder_flops(shape: dict[str, Any], lora_r: int | None = None) -> tuple[int, float]:
    """(non-embedding parameters N, training FLOPs per processed token) of a Qwen2 of ``shape`` (its
    random_init_config): 6N, or with LoRA adapters of rank ``lora_r`` 4N (the forward and the activations' gradients
    through the frozen weights) + 6 x the adapters' parameters (peft's default targets). Counted on the meta device:
    no memory, no weights."""
    import torch
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as LORA_TARGETS
    from transformers import AutoConfig, AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(AutoConfig.for_model("qwen2", **shape))
    params = sum(p.numel() for name, p in model.named_parameters() if "embed_tokens" not in name)
    if lora_r is None:
        return params, 6.0 * params
    targets = set(LORA_TARGETS["qwen2"])
    adapters = sum(lora_r * (module.in_features + module.out_features) for name, module in model.named_modules()
                   if name.rsplit(".", 1)[-1] in targets)
    return params, 4.0 * params + 6.0 * adapters
