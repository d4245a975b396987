"""Just enough ELF64 reading for the build and the reproducibility check, with no binutils.

- `sections`: name -> bytes of every section, to say which sections of two binaries differ.
- `required_versions`: the symbol versions (GLIBC_2.34, GLIBCXX_3.4.29, ...) a shared object
  needs from its libraries (.gnu.version_r), to keep the wheel's manylinux tag honest.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_SHT_GNU_VERNEED = 0x6FFFFFFE


class ElfError(ValueError):
    """Not a little-endian ELF64 file, or a truncated one."""


@dataclass(frozen=True, slots=True)
class Section:
    name: str
    kind: int
    offset: int
    size: int
    link: int
    info: int


def _header(data: bytes) -> tuple[int, int, int, int]:
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ElfError("not a little-endian ELF64 file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    return shoff, shentsize, shnum, shstrndx


def _string(table: bytes, offset: int) -> str:
    end = table.index(b"\0", offset)
    return table[offset:end].decode("utf-8", "replace")


def section_headers(data: bytes) -> list[Section]:
    shoff, shentsize, shnum, shstrndx = _header(data)
    raw = []
    for index in range(shnum):
        fields = struct.unpack_from("<IIQQQQIIQQ", data, shoff + index * shentsize)
        name, kind, _flags, _addr, offset, size, link, info = fields[:8]
        raw.append((name, kind, offset, size, link, info))
    names_offset, names_size = raw[shstrndx][2], raw[shstrndx][3]
    names = data[names_offset : names_offset + names_size]
    return [Section(_string(names, n), k, o, s, link, info) for n, k, o, s, link, info in raw]


def sections(data: bytes) -> dict[str, bytes]:
    """Section name -> contents (empty for NOBITS); duplicate names get a '#index' suffix."""
    result: dict[str, bytes] = {}
    for index, section in enumerate(section_headers(data)):
        key = section.name if section.name not in result else f"{section.name}#{index}"
        body = b"" if section.kind == 8 else data[section.offset : section.offset + section.size]
        result[key] = body
    return result


def required_versions(data: bytes) -> set[str]:
    """Names of every version needed from other objects (the Vernaux entries of .gnu.version_r)."""
    headers = section_headers(data)
    needed: set[str] = set()
    for section in headers:
        if section.kind != _SHT_GNU_VERNEED:
            continue
        strings = headers[section.link]
        table = data[strings.offset : strings.offset + strings.size]
        entry = section.offset
        for _ in range(section.info):
            _version, count, _file, aux, following = struct.unpack_from("<HHIII", data, entry)
            cursor = entry + aux
            for _ in range(count):
                _hash, _flags, _other, name, aux_next = struct.unpack_from("<IHHII", data, cursor)
                needed.add(_string(table, name))
                cursor += aux_next
            entry += following
    return needed


def max_version(versions: set[str], prefix: str) -> tuple[int, ...]:
    """The highest dotted version among names like 'GLIBC_2.34' for prefix 'GLIBC_'."""
    found = [
        tuple(int(part) for part in name[len(prefix) :].split("."))
        for name in versions
        if name.startswith(prefix) and name[len(prefix) :].replace(".", "").isdigit()
    ]
    return max(found, default=(0,))
