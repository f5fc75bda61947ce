"""Thrift compact protocol, both ways, for Parquet's page headers and footer, and the
Parquet enums in them.

Parquet stores its page headers and its footer (``FileMetaData``) as Thrift structs in
the compact protocol (parquet.thrift). The project writes the int8 layer columns' pages
itself (``schemas.int8_column_chunk``) and assembles the footer of such a file from
pyarrow's (``schemas.parquet_assembly``), so it needs to decode a struct it does not
fully understand and write it back unchanged but for the fields it edits.

A value is kept with its wire type, so a decoded struct encodes back to the same bytes:

* a struct is ``dict[field id, (type, value)]``;
* a list or set value is ``(element type, [elements])``, the elements bare;
* a map value is ``(key type, value type, [(key, value), ...])``;
* a bool is ``(BOOL, True/False)``, integers ``(I8/I16/I32/I64, int)``, a double
  ``(DOUBLE, float)``, binary and strings ``(BINARY, bytes)``.

The helpers ``i32``, ``i64``, ``binary``, ``struct``, ``list_of`` build such values.
"""

from __future__ import annotations

import struct as _struct
from typing import Any

# Compact-protocol type codes (``BOOL`` stands for both TRUE (1) and FALSE (2) on the wire).
BOOL, I8, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = 1, 3, 4, 5, 6, 7, 8, 9, 10, \
    11, 12
_BOOL_FALSE = 2

# parquet.thrift's enums, once for the writer of int8 chunks (``int8_column_chunk``) and the
# readers of layer pages (``pipeline/lookup/layers``).
INT32 = 1  # Type
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY = 0, 2, 3, 8  # Encoding
DATA_PAGE, INDEX_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 1, 2, 3  # PageType
# CompressionCodec, by pyarrow's codec name ("lz4" is Hadoop-framed LZ4: never written).
CODEC_IDS = {"uncompressed": 0, "snappy": 1, "gzip": 2, "brotli": 4, "zstd": 6, "lz4_raw": 7}

Value = tuple[int, Any]
Struct = dict[int, Value]


class ThriftError(ValueError):
    """Bytes that are not a well-formed compact-protocol struct."""


# --------------------------------------------------------------------------- builders


def i32(value: int) -> Value:
    return (I32, int(value))


def i64(value: int) -> Value:
    return (I64, int(value))


def binary(value: bytes | str) -> Value:
    return (BINARY, value.encode() if isinstance(value, str) else bytes(value))


def struct(fields: Struct) -> Value:
    return (STRUCT, fields)


def list_of(element_type: int, elements: list[Any]) -> Value:
    return (LIST, (element_type, list(elements)))


# --------------------------------------------------------------------------- encode


def _write_varint(out: bytearray, n: int) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _write_bare(out: bytearray, kind: int, value: Any) -> None:
    """A value without a field header (list elements, map entries; bools as a byte)."""
    if kind == BOOL:
        out.append(BOOL if value else _BOOL_FALSE)
    elif kind == I8:
        out.append(value & 0xFF)
    elif kind in (I16, I32, I64):
        _write_varint(out, _zigzag(value) & 0xFFFFFFFFFFFFFFFF)
    elif kind == DOUBLE:
        out += _struct.pack("<d", value)
    elif kind == BINARY:
        _write_varint(out, len(value))
        out += value
    elif kind in (LIST, SET):
        element, items = value
        if len(items) < 15:
            out.append((len(items) << 4) | element)
        else:
            out.append(0xF0 | element)
            _write_varint(out, len(items))
        for item in items:
            _write_bare(out, element, item)
    elif kind == MAP:
        key_kind, value_kind, pairs = value
        _write_varint(out, len(pairs))
        if pairs:
            out.append((key_kind << 4) | value_kind)
        for key, item in pairs:
            _write_bare(out, key_kind, key)
            _write_bare(out, value_kind, item)
    elif kind == STRUCT:
        write_struct(out, value)
    else:
        raise ThriftError(f"unknown Thrift type {kind}")


def write_struct(out: bytearray, fields: Struct) -> None:
    """Append ``fields`` (in field-id order) and the stop byte to ``out``."""
    last = 0
    for field_id in sorted(fields):
        kind, value = fields[field_id]
        wire = (BOOL if value else _BOOL_FALSE) if kind == BOOL else kind
        delta = field_id - last
        if 0 < delta <= 15:
            out.append((delta << 4) | wire)
        else:
            out.append(wire)
            _write_varint(out, _zigzag(field_id))
        if kind != BOOL:
            _write_bare(out, kind, value)
        last = field_id
    out.append(0)


def encode_struct(fields: Struct) -> bytes:
    out = bytearray()
    write_struct(out, fields)
    return bytes(out)


# --------------------------------------------------------------------------- decode


def read_varint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """An unsigned LEB128 varint at ``pos`` (Thrift's, and the run headers of Parquet's
    RLE/bit-packed hybrid): (value, the position after it)."""
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise ThriftError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _read_bare(buf: bytes | memoryview, pos: int, kind: int) -> tuple[Any, int]:
    if kind in (BOOL, _BOOL_FALSE):
        return buf[pos] == BOOL, pos + 1
    if kind == I8:
        return _struct.unpack_from("<b", buf, pos)[0], pos + 1
    if kind in (I16, I32, I64):
        raw, pos = read_varint(buf, pos)
        return _unzigzag(raw), pos
    if kind == DOUBLE:
        return _struct.unpack_from("<d", buf, pos)[0], pos + 8
    if kind == BINARY:
        size, pos = read_varint(buf, pos)
        if pos + size > len(buf):
            raise ThriftError("truncated binary")
        return bytes(buf[pos:pos + size]), pos + size
    if kind in (LIST, SET):
        header = buf[pos]
        pos += 1
        size, element = header >> 4, header & 0x0F
        if size == 15:
            size, pos = read_varint(buf, pos)
        element = BOOL if element == _BOOL_FALSE else element
        items = []
        for _ in range(size):
            item, pos = _read_bare(buf, pos, element)
            items.append(item)
        return (element, items), pos
    if kind == MAP:
        size, pos = read_varint(buf, pos)
        key_kind = value_kind = 0
        if size:
            key_kind, value_kind = buf[pos] >> 4, buf[pos] & 0x0F
            pos += 1
        pairs = []
        for _ in range(size):
            key, pos = _read_bare(buf, pos, key_kind)
            item, pos = _read_bare(buf, pos, value_kind)
            pairs.append((key, item))
        return (key_kind, value_kind, pairs), pos
    if kind == STRUCT:
        return read_struct(buf, pos)
    raise ThriftError(f"unknown Thrift type {kind}")


def read_struct(buf: bytes | memoryview, pos: int = 0) -> tuple[Struct, int]:
    """The struct at ``pos`` and the position after its stop byte."""
    fields: Struct = {}
    field_id = 0
    while True:
        if pos >= len(buf):
            raise ThriftError("truncated struct")
        header = buf[pos]
        pos += 1
        if header == 0:
            return fields, pos
        kind, delta = header & 0x0F, header >> 4
        if delta:
            field_id += delta
        else:
            raw, pos = read_varint(buf, pos)
            field_id = _unzigzag(raw)
        if kind in (BOOL, _BOOL_FALSE):
            fields[field_id] = (BOOL, kind == BOOL)
        else:
            fields[field_id] = (kind, None)
            value, pos = _read_bare(buf, pos, kind)
            fields[field_id] = (kind, value)
