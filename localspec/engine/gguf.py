"""What a GGUF file's header says, read in pure Python without loading the model.

Used to explain why llama.cpp refused a file (truncated, wrong version) and to size a file before
it is written (`quantize` checks the free space first). Reading skips the metadata values, so a
262k-token vocabulary costs a fraction of a second, not the seconds `gguf.GGUFReader` takes.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

# Bytes per block and elements per block of the ggml types (ggml.c's type_traits).
_BLOCKS = {
    0: (4, 1), 1: (2, 1), 2: (18, 32), 3: (20, 32), 6: (22, 32), 7: (24, 32), 8: (34, 32), 9: (40, 32),
    10: (84, 256), 11: (110, 256), 12: (144, 256), 13: (176, 256), 14: (210, 256), 15: (292, 256),
    16: (66, 256), 17: (74, 256), 18: (98, 256), 19: (50, 256), 20: (18, 32), 21: (110, 256),
    22: (82, 256), 23: (136, 256), 24: (1, 1), 25: (2, 1), 26: (4, 1), 27: (8, 1), 28: (8, 1),
    29: (56, 256), 30: (2, 1), 34: (54, 256), 35: (66, 256), 39: (17, 32),
    40: (36, 64), 41: (18, 128),
}
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # GGUF value types
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The header cannot be read; the message says where and why."""


class TruncatedHeader(GGUFFormatError):
    """The file ends inside its header; the message says so in full."""


@dataclass(frozen=True)
class GGUFInfo:
    version: int
    n_tensors: int
    n_elements: int
    """Weights in all tensors together."""
    data_end: int | None
    """Where the last tensor's data ends, in bytes from the start of the file; None when a tensor
    has a type this table does not know."""
    file_size: int

    @property
    def truncated(self) -> bool:
        return self.data_end is not None and self.file_size < self.data_end


def read_info(path: str | Path) -> GGUFInfo:
    """The header of the GGUF at `path`; raises GGUFFormatError when it cannot be read."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            f.seek(0)
            if f.read(4) != b"GGUF":
                raise GGUFFormatError("no GGUF magic")
            raise _truncated(size, "first 24 bytes")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(buf, size)


_MAX_DIMS = 4  # GGML_MAX_DIMS


def _truncated(size: int, part: str) -> TruncatedHeader:
    return TruncatedHeader(f"truncated GGUF header: the file ends at byte {size:,}, inside its {part} "
                           "(an interrupted download or copy?)")


def _parse(buf, size: int) -> GGUFInfo:
    if buf[:4] != b"GGUF":
        raise GGUFFormatError("no GGUF magic")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise GGUFFormatError(f"GGUF version {version}; llama.cpp reads versions 2 and 3")
    if n_kv > 1 << 16 or n_tensors > 1 << 20:  # real files: dozens of keys, thousands of tensors
        raise GGUFFormatError(f"implausible header: {n_kv} metadata keys, {n_tensors} tensors")
    pos = 24
    alignment = 32
    part = "metadata"
    try:
        for _ in range(n_kv):
            key, pos = _string(buf, pos)
            (kind,) = struct.unpack_from("<I", buf, pos)
            value_at = pos + 4
            pos = _skip(buf, value_at, kind)
            if key == b"general.alignment" and kind == 4:
                (alignment,) = struct.unpack_from("<I", buf, value_at)
        n_elements, ends, known = 0, [], True
        part = "list of tensors"
        for _ in range(n_tensors):
            _, pos = _string(buf, pos)
            (n_dims,) = struct.unpack_from("<I", buf, pos)
            if n_dims > _MAX_DIMS:
                raise GGUFFormatError(f"a tensor at byte {pos} claims {n_dims} dimensions (ggml has at most {_MAX_DIMS})")
            dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
            kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
            pos += 4 + 8 * n_dims + 12
            count = 1
            for d in dims:
                count *= d
            n_elements += count
            if kind in _BLOCKS:
                nbytes, per = _BLOCKS[kind]
                ends.append(offset + count // per * nbytes)
            else:
                known = False
    except (struct.error, _PastTheEnd):  # a read ran past the end of the file
        raise _truncated(size, part) from None
    if pos > size:
        raise _truncated(size, part)
    data_start = -(-pos // alignment) * alignment
    data_end = data_start + max(ends, default=0) if known else None
    return GGUFInfo(version, n_tensors, n_elements, data_end, size)


class _PastTheEnd(Exception):
    """A value that runs past the end of the file."""


def _string(buf, pos: int) -> tuple[bytes, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    if n > len(buf):
        raise GGUFFormatError(f"a string at byte {pos} claims {n} bytes")
    if pos + 8 + n > len(buf):
        raise _PastTheEnd
    return bytes(buf[pos + 8: pos + 8 + n]), pos + 8 + n


def _skip(buf, pos: int, kind: int) -> int:
    if kind in _SCALAR:
        return pos + _SCALAR[kind]
    if kind == _STRING:
        return _string(buf, pos)[1]
    if kind == _ARRAY:
        item, n = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in _SCALAR:
            if n * _SCALAR[item] > len(buf):
                raise GGUFFormatError(f"an array at byte {pos - 12} claims {n} values")
            return pos + n * _SCALAR[item]
        if item == _STRING:
            unpack = struct.Struct("<Q").unpack_from
            for _ in range(n):  # a tokenizer's vocabulary: 262k strings take ~0.1 s
                pos += 8 + unpack(buf, pos)[0]
            if pos > len(buf):
                raise _PastTheEnd
            return pos
        raise GGUFFormatError(f"array of unknown GGUF type {item} at byte {pos}")
    raise GGUFFormatError(f"unknown GGUF value type {kind} at byte {pos}")
