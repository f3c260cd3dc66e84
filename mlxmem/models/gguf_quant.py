"""GGUF tensors into MLX arrays at the source's precision: llama.cpp's block quantization mapped
onto MLX's own affine quantization (`w = scale * q + bias` per group of 32 along a row).

The values come from llama.cpp's own Python reader (`gguf.quants.dequantize`), so every type
it knows is read the way llama.cpp reads it. For the types that are affine per group of 32, the
group's scale and bias are read from the block header and the integer codes recovered from the
values, so the MLX tensor holds the same numbers:

| GGUF | in GGUF | in MLX | exact? |
|---|---|---|---|
| Q4_0 | `d * (q - 8)`, q 4-bit, 32 per block | 4-bit g32, scale d, bias -8d | yes |
| Q4_1 | `d * q + m` | 4-bit g32, scale d, bias m | yes |
| Q5_0 | `d * (q - 16)`, q 5-bit | 5-bit g32, scale d, bias -16d | yes |
| Q5_1 | `d * q + m` | 5-bit g32 | yes |
| Q8_0 | `d * q`, q int8 | 8-bit g32, scale d, bias -128d | yes |
| Q4_K | 8 sub-blocks of 32: `d*sc * q - dmin*m`, sc, m 6-bit | 4-bit g32 | float16 scale, bias |
| Q5_K | the same with 5-bit q | 5-bit g32 | float16 scale and bias |
| Q6_K | 16 sub-blocks of 16: `d*sc * (q - 32)`, sc int8 | 8-bit g32 (below) | see below |
| F32, F16, BF16 | | kept as they are | yes |
| the rest (Q2_K, Q3_K, IQ*, TQ*, MXFP4, ...) | | dequantized to float16 | float16 rounding |

Q6_K: MLX has no group of 16, and a group of 32 spans two sub-blocks with different scales.
It becomes an 8-bit group whose step is a quarter of the larger sub-block's step (8 bits hold
the 6-bit codes of that sub-block times 4, exactly); the other sub-block's values are rounded to
that finer grid, an error of at most 1/8 of its own pair's larger Q6_K step (1/4 at the single
clipped extreme of equal-and-opposite scales). That is far below Q6_K's own rounding (half a
step) and costs 8.5 bits per weight instead of 6.56; measured on Qwen2.5-Coder-0.5B the
perplexity is unchanged (docs/notebook/benchmarks.md, "GGUF conversion: nothing lost").

Scales and biases are stored as float16 (as in mlx-community's models); where float16 cannot
hold a tensor's scales within its rounding (overflow, subnormals) that tensor keeps float32
scales. On the CPU the model is dequantized to float32 at load (mlxmem/cpu.py).
Only 2-D `.weight` tensors stay quantized (they feed Linear and Embedding layers); anything
else quantized is dequantized.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 32
# GGUF type name -> MLX bits, for the types held as MLX affine groups of 32.
AFFINE_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}
AFFINE_BITS["Q6_K"] = 8
KEPT_FLOAT = ("F32", "F16", "BF16")  # stay floats of the same type
# Rows converted at a time: bounds the float32 working copy of a large tensor (~256 MB).
CHUNK_ELEMENTS = 1 << 26


@dataclass
class Converted:
    """One tensor in MLX form: `weight` alone (float), or weight/scales/biases (quantized)."""

    weight: np.ndarray
    scales: np.ndarray | None = None
    biases: np.ndarray | None = None
    bits: int | None = None
    dtype: str = "float16"  # of the float weight or of the scales: float32, float16, bfloat16

    def quantization(self) -> tuple[np.ndarray, np.ndarray, int] | None:
        """(scales, biases, bits) of a quantized tensor; None for a float one."""
        if self.scales is None:
            return None
        assert self.biases is not None and self.bits is not None  # set with the scales
        return self.scales, self.biases, self.bits


def supported_types() -> set[str]:
    """Every GGUF type llama.cpp's Python reader dequantizes."""
    import gguf.quants as quants
    from gguf import GGMLQuantizationType

    return {
        t.name
        for t in GGMLQuantizationType
        if t.name in ("F32", "F16") or isinstance(getattr(quants, t.name, None), type)
    }


def dequantize(raw: np.ndarray, type_name: str) -> np.ndarray:
    """float32 values of `raw` (rows of blocks, as GGUFReader gives them) by llama.cpp's rules."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    return gguf_dequantize(raw, GGMLQuantizationType[type_name])


def convert(raw: np.ndarray, type_name: str, quantizable: bool) -> Converted:
    """`raw` (GGUFReader's tensor data: 2-D rows, or 1-D) of GGUF type `type_name` in MLX form.

    `quantizable`: the tensor is a 2-D weight of a Linear or Embedding layer, which may stay
    quantized; otherwise it comes back as floats."""
    if type_name in KEPT_FLOAT:
        values = dequantize(raw, type_name)
        return _float(values, type_name)
    if not quantizable or type_name not in AFFINE_BITS or raw.ndim != 2:
        return _float(dequantize(raw, type_name), "quantized")
    rows = raw.shape[0]
    step = max(1, CHUNK_ELEMENTS // max(1, raw.shape[1] * 4))
    parts = [_affine(raw[i : i + step], type_name) for i in range(0, rows, step)]
    weight = np.concatenate([p[0] for p in parts])
    scales = np.concatenate([p[1] for p in parts])
    biases = np.concatenate([p[2] for p in parts])
    ok16 = all(p[3] for p in parts)
    dtype = np.float16 if ok16 else np.float32
    return Converted(
        weight,
        scales.astype(dtype),
        biases.astype(dtype),
        AFFINE_BITS[type_name],
        "float16" if ok16 else "float32",
    )


def _float(values: np.ndarray, source: str) -> Converted:
    if source == "F32":
        return Converted(values.astype(np.float32, copy=False), dtype="float32")
    if source == "BF16":
        return Converted(values, dtype="bfloat16")  # float32 values that bfloat16 holds exactly
    half = values.astype(np.float16)
    if np.isfinite(half).all() or not np.isfinite(values).all():
        return Converted(half, dtype="float16")
    return Converted(values, dtype="float32")  # beyond float16's range: keep float32


def group_params(blocks: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray]:
    """float32 (scale, bias) of each group of 32 in `blocks` (n_blocks, type_size) uint8:
    shape (n_blocks, groups per block)."""
    from gguf.quants import Q4_K

    def f16(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a).view(np.float16).astype(np.float32)

    d = f16(blocks[:, 0:2])
    if type_name == "Q4_0":
        return d, -8 * d
    if type_name == "Q5_0":
        return d, -16 * d
    if type_name == "Q8_0":
        return d, -128 * d
    if type_name in ("Q4_1", "Q5_1"):
        return d, f16(blocks[:, 2:4])
    if type_name in ("Q4_K", "Q5_K"):
        sc, m = Q4_K.get_scale_min(np.ascontiguousarray(blocks[:, 4:16]))
        return d * sc.astype(np.float32), -f16(blocks[:, 2:4]) * m.astype(np.float32)
    if type_name == "Q6_K":
        sc = np.ascontiguousarray(blocks[:, 192:208]).view(np.int8).astype(np.int32)
        d = f16(blocks[:, 208:210])
        pairs = sc.reshape(-1, 8, 2)  # the two 16-element sub-blocks of each group of 32
        larger = np.take_along_axis(pairs, np.abs(pairs).argmax(-1)[..., None], -1)[..., 0]
        scale = d * larger.astype(np.float32) / 4
        return scale, -128 * scale
    raise ValueError(f"{type_name} is not an affine type")


def _affine(raw: np.ndarray, type_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Rows of `type_name` blocks -> (packed uint32 codes, scales, biases, float16 holds them)."""
    bits = AFFINE_BITS[type_name]
    rows = raw.shape[0]
    values = dequantize(raw, type_name)  # (rows, columns) float32
    columns = values.shape[1]
    blocks = np.ascontiguousarray(raw).reshape(-1, _type_size(type_name))
    scale, bias = group_params(blocks, type_name)
    scale, bias = scale.reshape(rows, columns // GROUP), bias.reshape(rows, columns // GROUP)
    ok16 = _float16_holds(scale, bias)
    if ok16:
        scale = scale.astype(np.float16).astype(np.float32)
        bias = bias.astype(np.float16).astype(np.float32)
    groups = values.reshape(rows, -1, GROUP)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.rint((groups - bias[..., None]) / scale[..., None])
    codes = np.where(scale[..., None] == 0, 0, codes)
    codes = np.clip(codes, 0, (1 << bits) - 1).astype(np.uint8).reshape(rows, columns)
    return pack(codes, bits), scale, bias, ok16


def _float16_holds(scale: np.ndarray, bias: np.ndarray) -> bool:
    """Whether float16 keeps every scale and bias exactly or within its rounding (half a unit
    in the last place; no overflow, no precision lost to subnormals)."""
    for a in (scale, bias):
        with np.errstate(over="ignore"):
            half = a.astype(np.float16).astype(np.float32)
        if not np.isfinite(half).all():
            return False
        if not ((half == a) | (np.abs(half - a) <= np.abs(a) * 2.0**-11)).all():
            return False
    return True


def _type_size(type_name: str) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][1]


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """(rows, columns) uint8 codes -> MLX's packed uint32 layout: a little-endian bit stream,
    element j at bits [j*bits, (j+1)*bits) of each row."""
    rows = codes.shape[0]
    if bits == 8:
        return np.ascontiguousarray(codes).view("<u4").reshape(rows, -1)
    if bits == 4:
        pairs = codes.reshape(rows, -1, 2)
        low, high = pairs[..., 0], pairs[..., 1] << np.uint8(4)
        return np.ascontiguousarray(low | high).view("<u4").reshape(rows, -1)
    stream = np.unpackbits(codes[..., None], axis=-1, bitorder="little")[..., :bits]
    packed = np.packbits(stream.reshape(rows, -1), axis=-1, bitorder="little")
    return packed.view("<u4").reshape(rows, -1)


def reconstruct(c: Converted) -> np.ndarray:
    """The float32 values `c` stands for (MLX's dequantization, done in numpy, for checks)."""
    quantized = c.quantization()
    if quantized is None:
        return np.asarray(c.weight, dtype=np.float32)
    scales, biases, bits = quantized
    rows = c.weight.shape[0]
    stream = np.unpackbits(c.weight.view(np.uint8).reshape(rows, -1), axis=-1, bitorder="little")
    weights = 1 << np.arange(bits, dtype=np.uint32)
    codes = (stream.reshape(rows, -1, bits).astype(np.uint32) * weights).sum(-1)
    groups = codes.reshape(rows, -1, GROUP).astype(np.float32)
    scale = scales.astype(np.float32)[..., None]
    bias = biases.astype(np.float32)[..., None]
    return (groups * scale + bias).reshape(rows, -1)
