#!/usr/bin/env bash
# Static checks of the Bazel and Nix files, for machines where Bazel >= 7 and nixpkgs are out of
# reach (see DESIGN.md §6):
#   1. buildifier (npm @bazel/buildifier, version and integrity pinned in package-lock.json) in
#      check mode (formatting) and lint mode (all warnings) over every Bazel file;
#   2. tools/bazel/check_starlark.py: evaluates the files with stubbed rules and checks labels,
#      attributes, test coverage, extension sources and version agreement;
#   3. nix-instantiate --parse flake.nix, when Nix is installed (Debian: nix-bin).
# Usage: tools/check_build_files.sh [PYTHON]   (default: .venv/bin/python, else python3)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="${1:-}"
if [[ -z "$python" ]]; then
  if [[ -x .venv/bin/python ]]; then python=.venv/bin/python; else python=python3; fi
fi

# npm ci installs exactly what package-lock.json pins (integrity checked) into ./node_modules.
buildifier=node_modules/.bin/buildifier
if [[ ! -x "$buildifier" ]] || ! "$buildifier" --version 2>/dev/null | grep -q "8.2.1"; then
  npm ci --no-audit --no-fund --loglevel=error
fi

mapfile -t files < <(
  find . \( -name .git -o -name node_modules -o -name '.venv*' -o -name 'bazel-*' \
         -o -path ./build -o -path ./dist \) -prune -o \
       -type f \( -name MODULE.bazel -o -name BUILD.bazel -o -name BUILD -o -name '*.bzl' \) \
       -print | sort
)
echo "$("$buildifier" --version | head -1 | tr -s " ") on ${#files[@]} files"

# Default lint warnings, less unsorted-dict-items: extension.bzl orders its per-arch tables by
# architecture (sm_90a before sm_100a), which is clearer than lexicographic order.
status=0
"$buildifier" --mode=check --lint=warn --warnings=-unsorted-dict-items "${files[@]}" || status=1

"$python" tools/bazel/check_starlark.py "$root" || status=1

if command -v nix-instantiate >/dev/null; then
  # Parsing needs no store or daemon; the empty build-users-group silences the missing nixbld group.
  NIX_CONFIG="build-users-group =" nix-instantiate --parse flake.nix >/dev/null && echo "flake.nix parses" || status=1
else
  echo "nix-instantiate not installed: flake.nix is checked structurally by tests/cpu/test_nix_flake.py"
fi
exit "$status"
