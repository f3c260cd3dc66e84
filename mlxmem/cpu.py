"""Running on a CPU without a GPU: what makes MLX fast there.

MLX's quantized matmuls on the CPU are far slower than float32 matmuls through a BLAS, so on a
CPU-only machine a quantized model is dequantized to float32 once at load. The `mlx[cpu]` wheel
links a reference BLAS; a system OpenBLAS, preloaded into the process, is several times faster
(see benchmarks/cpu-speed.md). Never used when MLX runs on a GPU (Metal or CUDA).
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3")
# Set to 0 to keep a quantized model quantized on the CPU; set to anything to skip OpenBLAS.
DEQUANTIZE_ENV = "MLXMEM_CPU_DEQUANTIZE"
NO_OPENBLAS_ENV = "MLXMEM_NO_OPENBLAS"


def on_cpu_only() -> bool:
    """Whether MLX computes on the CPU (no Metal, no CUDA device by default)."""
    import mlx.core as mx

    return mx.default_device().type == mx.DeviceType.cpu


def dequantize_for_cpu(model) -> bool:
    """Dequantize `model` to float32 in place when it runs on the CPU; return whether it did."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.utils import dequantize_model

    if os.environ.get(DEQUANTIZE_ENV, "1") == "0" or not on_cpu_only():
        return False
    quantized = [m for _, m in model.named_modules() if isinstance(m, nn.QuantizedLinear)]
    if not quantized and not _has_quantized_embedding(model):
        return False
    dequantize_model(model)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    return True


def _has_quantized_embedding(model) -> bool:
    import mlx.nn as nn

    return any(isinstance(m, nn.QuantizedEmbedding) for _, m in model.named_modules())


def set_blas_threads(threads: int) -> bool:
    """Have the preloaded OpenBLAS compute with `threads` threads; False where none is loaded
    (MLX's own CPU kernels have no thread setting: its float32 matmuls are the BLAS's)."""
    try:
        blas = ctypes.CDLL(str(OPENBLAS), mode=os.RTLD_NOLOAD)  # only if already loaded
    except OSError:
        return False
    setter = getattr(blas, "openblas_set_num_threads", None)
    if setter is None:
        return False
    setter(threads)
    return True


def openblas_argv() -> tuple[dict[str, str], list[str]] | None:
    """The environment and argv to re-run this process with OpenBLAS preloaded, or None when
    that is not possible or not wanted (not Linux, no OpenBLAS, already preloaded, opted out)."""
    env = dict(os.environ)
    if sys.platform != "linux" or not OPENBLAS.is_file() or env.get(NO_OPENBLAS_ENV):
        return None
    preload = env.get("LD_PRELOAD", "")
    if str(OPENBLAS) in preload.split(":"):
        return None
    env["LD_PRELOAD"] = f"{OPENBLAS}:{preload}" if preload else str(OPENBLAS)
    env[NO_OPENBLAS_ENV] = "1"  # never twice, whatever happens to LD_PRELOAD in between
    return env, [sys.executable, *sys.orig_argv[1:]]


def reexec_with_openblas() -> None:
    """Replace this process by itself with OpenBLAS preloaded, when openblas_argv allows."""
    planned = openblas_argv()
    if planned is None:
        return
    env, argv = planned
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)
