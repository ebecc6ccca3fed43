"""The tensor table of a GGUF file (names, types, shapes), read by stepping over its metadata.

gguf-py's ``GGUFReader`` builds a numpy view of every metadata value on the way, 150k token strings and 150k merges for
a Qwen vocabulary: 5.9 s for each file of the default pair on the 2-core Xeon, paid at every model load on an AMX CPU
(core.backends.weight_buffers needs the table there). Stepping over the values reads one length per string: 0.09 s.
Layout (GGUF v2/v3, little-endian): magic, version, tensor count, metadata count, the metadata (key, type, value),
then one entry per tensor (name, dimension count, dimensions, type, offset).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9
MAX_DIMS = 4            # GGML_MAX_DIMS
# byte size of each fixed-size metadata value type: uint8, int8, uint16, int16, uint32, int32, float32, bool,
# (string), (array), uint64, int64, float64
FIXED_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_id: int                 # ggml's type number (gguf.GGMLQuantizationType)
    shape: tuple[int, ...]       # ggml's order: the row length first


def read_tensor_infos(path: str | Path) -> list[TensorInfo]:
    """The tensors of the GGUF file at ``path``. Raises ValueError when it is not one (or is cut short), OSError when
    it cannot be read."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _Walker(data).tensors()


class _Walker:
    def __init__(self, data) -> None:
        self.data = data
        self.at = 0

    def _unpack(self, fmt: str):
        try:
            values = struct.unpack_from(fmt, self.data, self.at)
        except struct.error:
            raise ValueError("the file ends inside its GGUF header") from None
        self.at += struct.calcsize(fmt)
        return values

    def _string(self) -> bytes:
        (length,) = self._unpack("<Q")
        start, self.at = self.at, self.at + length
        if self.at > len(self.data):
            raise ValueError("the file ends inside its GGUF header")
        return self.data[start:self.at]

    def _skip_value(self, kind: int) -> None:
        if kind == STRING:
            self._string()
        elif kind == ARRAY:
            item, count = self._unpack("<IQ")
            if item in FIXED_SIZES:
                self.at += FIXED_SIZES[item] * count
            else:
                for _ in range(count):
                    self._skip_value(item)
        elif kind in FIXED_SIZES:
            self.at += FIXED_SIZES[kind]
        else:
            raise ValueError(f"unknown GGUF metadata type {kind}")

    def tensors(self) -> list[TensorInfo]:
        if bytes(self.data[:4]) != MAGIC:
            raise ValueError("not a GGUF file (its first bytes are not 'GGUF')")
        self.at = 4
        version, n_tensors, n_kv = self._unpack("<IQQ")
        if version < 2:
            raise ValueError(f"GGUF version {version} is too old to read")
        for _ in range(n_kv):
            self._string()
            (kind,) = self._unpack("<I")
            self._skip_value(kind)
        out = []
        for _ in range(n_tensors):
            name = self._string().decode("utf-8", "replace")
            (dims,) = self._unpack("<I")
            if dims > MAX_DIMS:
                raise ValueError(f"tensor {name!r} claims {dims} dimensions")
            shape = self._unpack(f"<{dims}Q")
            type_id, _offset = self._unpack("<IQ")
            out.append(TensorInfo(name, type_id, tuple(shape)))
        return out
