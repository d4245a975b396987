"""Byte-reproducible wheel and sdist writers.

Same inputs -> same bytes: entries sorted (dist-info last, RECORD last of all), one timestamp from
SOURCE_DATE_EPOCH (default: a fixed date), fixed permissions (0644, 0755 for shared objects),
fixed owner in tarballs, no extra zip fields, deflate at a fixed level.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import os
import tarfile
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path

# 2024-01-01T00:00:00Z: used when SOURCE_DATE_EPOCH is not set, so plain builds reproduce too.
DEFAULT_EPOCH = 1704067200
# The zip format cannot store times before 1980.
_ZIP_MIN_EPOCH = 315532800


def source_date_epoch(environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    value = environ.get("SOURCE_DATE_EPOCH", "")
    return int(value) if value.strip() else DEFAULT_EPOCH


def _mode(name: str) -> int:
    return 0o755 if name.endswith(".so") else 0o644


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def _zip_entry(archive: zipfile.ZipFile, name: str, data: bytes, epoch: int) -> None:
    info = zipfile.ZipInfo(name, date_time=time.gmtime(max(epoch, _ZIP_MIN_EPOCH))[:6])
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # Unix, so that external_attr carries the permission bits
    info.external_attr = (0o100000 | _mode(name)) << 16
    archive.writestr(info, data, compresslevel=9)


def write_wheel(path: Path, files: Mapping[str, bytes], dist_info: str, epoch: int) -> None:
    """Write `files` ({archive name: bytes}, dist-info files included) plus RECORD to `path`."""
    record_name = f"{dist_info}/RECORD"
    names = sorted(files, key=lambda name: (name.startswith(f"{dist_info}/"), name))
    lines = [f"{name},{_record_hash(files[name])},{len(files[name])}" for name in names]
    lines.append(f"{record_name},,")
    record = ("\n".join(lines) + "\n").encode("utf-8")
    with zipfile.ZipFile(path, "w") as archive:
        for name in names:
            _zip_entry(archive, name, files[name], epoch)
        _zip_entry(archive, record_name, record, epoch)


def write_sdist(path: Path, files: Mapping[str, bytes], epoch: int) -> None:
    """A .tar.gz of `files` ({archive name: bytes}) with normalized owners, modes and times."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            info = tarfile.TarInfo(name)
            info.size = len(files[name])
            info.mtime = epoch
            info.mode = _mode(name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(files[name]))
    # The gzip header holds a time and a file name; both are fixed here.
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=epoch, compresslevel=9) as gz,
    ):
        gz.write(buffer.getvalue())
