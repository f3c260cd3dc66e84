"""Reading a GGUF file's header: metadata and tensor table, checked before any weight is read.

llama.cpp's own reader (`gguf.GGUFReader`) reads the weights, but only after this parser has
checked the header: GGUFReader trusts the file (a hostile count makes it loop for ages, nested
arrays overflow the stack, a truncated file raises IndexError), so a foreign, truncated, hostile
or unsupported file is refused here with a clear message before any conversion.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mlxmem.errors import ModelLoadError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 16
MAX_ARRAY_DEPTH = 4  # arrays of arrays: llama.cpp writes none; a hostile file nests thousands

# Metadata value types: struct format for the scalar ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


def type_sizes() -> dict[int, tuple[str, int, int]]:
    """Every ggml tensor type llama.cpp's Python package knows: id -> (name, elements per
    block, bytes per block)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return {int(t): (t.name, *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType}


class GGUFError(ModelLoadError):
    """A file that is not a GGUF model mlxmem can convert (foreign, truncated, unsupported)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # as GGUF lists it: innermost dimension first
    type_id: int
    offset: int  # from the start of the data section

    @property
    def type_name(self) -> str:
        known = type_sizes().get(self.type_id)
        return known[0] if known else f"type {self.type_id}"

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        _, per_block, block_bytes = type_sizes()[self.type_id]
        return self.elements // per_block * block_bytes


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_start: int
    file_size: int
    alignment: int = DEFAULT_ALIGNMENT

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """A `<arch>.<key>` metadata value, e.g. `block_count`."""
        return self.metadata.get(f"{self.arch}.{key}", default)


def read_header(path: Path) -> GGUFHeader:
    """Parse and check a GGUF header; raise GGUFError for anything that is not one we read."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path} is not a file")
    size = path.stat().st_size
    with open(path, "rb") as f:
        try:
            header = _parse(f, path, size)
        except (struct.error, EOFError, UnicodeDecodeError, MemoryError, OverflowError):
            raise GGUFError(f"{path}: truncated or corrupt GGUF header") from None
    check_tensors(header)
    return header


def check_tensors(header: GGUFHeader) -> None:
    """Every tensor of a type llama.cpp's reader dequantizes, whole blocks per row, and all of
    its bytes inside the file."""
    from .gguf_quant import supported_types

    supported = supported_types()
    known = type_sizes()
    unsupported = sorted({t.type_name for t in header.tensors if t.type_name not in supported})
    if unsupported:
        raise GGUFError(
            f"{header.path.name} has tensors of type {', '.join(unsupported)}, which mlxmem cannot "
            f"convert. Supported: {', '.join(sorted(supported))}."
        )
    names = set()
    for t in header.tensors:
        per_block = known[t.type_id][1]
        if t.name in names:
            raise GGUFError(f"{header.path.name}: tensor {t.name!r} appears twice")
        names.add(t.name)
        if not t.shape or min(t.shape) < 1 or t.shape[0] % per_block:
            raise GGUFError(
                f"{header.path.name}: tensor {t.name!r} has shape {t.shape}, which is not whole "
                f"{t.type_name} blocks of {per_block}"
            )
        if t.offset % header.alignment:
            raise GGUFError(f"{header.path.name}: tensor {t.name!r} is not aligned")
    end = max((header.data_start + t.offset + t.nbytes for t in header.tensors), default=0)
    if end > header.file_size:
        raise GGUFError(
            f"{header.path}: truncated: its tensors need {end:,} bytes, the file has "
            f"{header.file_size:,}"
        )


def _parse(f: BinaryIO, path: Path, size: int) -> GGUFHeader:
    magic = f.read(4)
    if magic != MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    version = _read(f, "<I")
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = _read(f, "<Q"), _read(f, "<Q")
    if n_tensors > size or n_kv > size:  # counts from a corrupt header
        raise EOFError
    metadata = {}
    for _ in range(n_kv):
        key = _read_string(f)
        if key in metadata:
            raise GGUFError(f"{path}: metadata key {key!r} appears twice")
        metadata[key] = _read_value(f, _read(f, "<I"), size)
    tensors = [_read_tensor_info(f) for _ in range(n_tensors)]
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        type(alignment) is not int
        or not 0 < alignment <= MAX_ALIGNMENT
        or alignment & (alignment - 1)
    ):
        raise GGUFError(
            f"{path}: general.alignment {alignment!r} is not a power of two up to {MAX_ALIGNMENT}"
        )
    data_start = -(-f.tell() // alignment) * alignment
    return GGUFHeader(path, version, metadata, tensors, data_start, size, alignment)


def _read(f: BinaryIO, fmt: str) -> Any:
    n = struct.calcsize(fmt)
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return struct.unpack(fmt, data)[0]


def _read_string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    if n > 1 << 31:  # beyond any real string, and beyond what read() should be asked for
        raise EOFError
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data.decode("utf-8")


def _read_value(f: BinaryIO, kind: int, size: int, depth: int = 0) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _read_string(f)
    if kind == _ARRAY:
        item_kind, count = _read(f, "<I"), _read(f, "<Q")
        if count > size:  # each item takes at least a byte
            raise EOFError
        if item_kind in _SCALARS:
            return _read_scalars(f, _SCALARS[item_kind], count)
        if item_kind == _ARRAY and depth >= MAX_ARRAY_DEPTH:
            raise GGUFError(f"metadata arrays nested deeper than {MAX_ARRAY_DEPTH}")
        return [_read_value(f, item_kind, size, depth + 1) for _ in range(count)]
    raise GGUFError(f"unknown GGUF metadata value type {kind}")


def _read_scalars(f: BinaryIO, fmt: str, count: int) -> list:
    item = struct.calcsize(fmt)
    data = f.read(item * count)
    if len(data) != item * count:
        raise EOFError
    return [v[0] for v in struct.iter_unpack(fmt, data)]


def _read_tensor_info(f: BinaryIO) -> TensorInfo:
    name = _read_string(f)
    n_dims = _read(f, "<I")
    if n_dims > 8:
        raise EOFError
    shape = tuple(_read(f, "<Q") for _ in range(n_dims))
    return TensorInfo(name, shape, _read(f, "<I"), _read(f, "<Q"))
