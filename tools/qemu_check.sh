#!/usr/bin/env bash
# The aarch64 wheel's modules under emulation, on an x86_64 machine:
#
#   tools/qemu_check.sh dist/mok-*_aarch64.whl
#
# qemu-aarch64 runs the aarch64 glibc loader (Debian's cross sysroot, /usr/aarch64-linux-gnu) in
# --list mode on every mok/_C_*.so: each must be a loadable aarch64 object whose libraries
# (libstdc++, libgcc_s, libc, libm; no libcudart, no libcuda) all resolve. Python's own symbols
# stay unresolved: no aarch64 CPython 3.12 can be had here to import the modules. Skips, saying so,
# where qemu-aarch64 is not installed (Debian: qemu-user).
set -euo pipefail
wheel="${1:?usage: tools/qemu_check.sh WHEEL}"
sysroot="${QEMU_LD_PREFIX:-/usr/aarch64-linux-gnu}"
if ! command -v qemu-aarch64 >/dev/null; then
  echo "qemu_check: qemu-aarch64 not installed (apt-get install qemu-user): skipped"
  exit 0
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
python3 -m zipfile -e "$wheel" "$scratch"
shopt -s nullglob
modules=("$scratch"/mok/_C_*.so)
[[ ${#modules[@]} -gt 0 ]] || { echo "qemu_check: no mok/_C_*.so in $wheel" >&2; exit 1; }
for module in "${modules[@]}"; do
  listing="$(qemu-aarch64 -L "$sysroot" "$sysroot/lib/ld-linux-aarch64.so.1" --list "$module")"
  if grep -q "not found" <<<"$listing"; then
    echo "qemu_check: $(basename "$module") needs a library the aarch64 system lacks:" >&2
    echo "$listing" >&2
    exit 1
  fi
  needs="$(awk '/=>/ {print $1}' <<<"$listing" | sort | tr '\n' ' ')"
  echo "qemu_check: $(basename "$module") loads under qemu-aarch64; needs ${needs% }"
done
