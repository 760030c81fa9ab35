"""The bf16 dense tensor-core peak of common GPUs, for model-FLOP utilisation ("% of peak") in training summaries.

Vendor figures without sparsity (TFLOP/s). Looked up by the CUDA device name; a GPU not listed gets no share of
peak (its throughput is still reported).
"""

__all__ = ["BF16_DENSE_PEAK_TFLOPS", "bf16_dense_peak_tflops"]

BF16_DENSE_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("GH200", 989.0),
    ("H100", 989.0),  # SXM (e.g. "NVIDIA H100 80GB HBM3")
    ("H200", 989.0),
    ("H800", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
)
"""``(name fragment, TFLOP/s)``: the first fragment found in the device name decides (specific names first)."""


def bf16_dense_peak_tflops(device_name: str) -> float | None:
    """The bf16 dense peak of the GPU called ``device_name`` (``torch.cuda.get_device_name``), or None if unknown."""
    return next((peak for fragment, peak in BF16_DENSE_PEAK_TFLOPS if fragment in device_name), None)
