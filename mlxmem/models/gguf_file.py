"""Reading a GGUF file's header: metadata and tensor table, checked before any weight is read.

MLX reads GGUF weights itself (`mx.load`); this module only parses the header, so that a
foreign, truncated or unsupported file is refused with a clear message before conversion.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mlxmem.errors import ModelLoadError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# ggml tensor types MLX reads correctly: name, elements per block, bytes per block.
SUPPORTED_TYPES = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    8: ("Q8_0", 32, 34),
    30: ("BF16", 1, 2),
}
# The rest by name, for the error message.
OTHER_TYPES = {
    6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K",
    14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
    20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 34: "TQ1_0",
    35: "TQ2_0",
}  # fmt: skip

# Metadata value types: struct format for the scalar ones.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}  # fmt: skip
_STRING, _ARRAY = 8, 9


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
        if self.type_id in SUPPORTED_TYPES:
            return SUPPORTED_TYPES[self.type_id][0]
        return OTHER_TYPES.get(self.type_id, f"type {self.type_id}")

    @property
    def nbytes(self) -> int:
        _, per_block, block_bytes = SUPPORTED_TYPES[self.type_id]
        elements = 1
        for dim in self.shape:
            elements *= dim
        return elements // per_block * block_bytes


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data_start: int
    file_size: int

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
    """Every tensor of a supported type, and all of its bytes inside the file."""
    unsupported = sorted({t.type_name for t in header.tensors if t.type_id not in SUPPORTED_TYPES})
    if unsupported:
        supported = ", ".join(name for name, _, _ in SUPPORTED_TYPES.values())
        raise GGUFError(
            f"{header.path.name} has tensors of type {', '.join(unsupported)}, which mlxmem cannot "
            f"convert (MLX's GGUF reader dequantizes K-quants incorrectly and lacks the I-quants). "
            f"Supported: {supported}. Use a Q4_0, Q4_1, Q8_0 or F16 file of the same model."
        )
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
        metadata[key] = _read_value(f, _read(f, "<I"))
    tensors = [_read_tensor_info(f) for _ in range(n_tensors)]
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-f.tell() // alignment) * alignment
    return GGUFHeader(path, version, metadata, tensors, data_start, size)


def _read(f: BinaryIO, fmt: str) -> Any:
    n = struct.calcsize(fmt)
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return struct.unpack(fmt, data)[0]


def _read_string(f: BinaryIO) -> str:
    n = _read(f, "<Q")
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data.decode("utf-8")


def _read_value(f: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _read(f, _SCALARS[kind])
    if kind == _STRING:
        return _read_string(f)
    if kind == _ARRAY:
        item_kind, count = _read(f, "<I"), _read(f, "<Q")
        if item_kind in _SCALARS:
            return _read_scalars(f, _SCALARS[item_kind], count)
        return [_read_value(f, item_kind) for _ in range(count)]
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
