#!/usr/bin/env bash
# Test what ships: install the built wheel into a fresh environment and run the suite against it.
#
#   tools/test_wheel.sh [pytest args...]          e.g. tools/test_wheel.sh -m gpu -x
#
# The wheel is $MOK_WHEEL, else the one dist/mok-*_<this CPU>.whl (`make wheel` or tools/repro_check.py put
# it there). The fresh environment (.venv-test) gets only the wheel (--no-deps); a .pth file
# makes the locked dependencies of .venv (torch, pytest, ...) importable without downloading
# anything. pytest runs through a console script of that environment with --import-mode=importlib,
# so neither the working directory nor the tests' directories enter sys.path and `import mok`
# can only find the installed wheel; MOK_EXPECT_INSTALLED=1 makes a test assert exactly that.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
locked="${MOK_LOCKED_VENV:-$repo/.venv}"
fresh="${MOK_TEST_VENV:-$repo/.venv-test}"

wheel="${MOK_WHEEL:-}"
if [[ -z "$wheel" ]]; then
  shopt -s nullglob
  wheels=("$repo"/dist/mok-*_"$(uname -m)".whl)  # dist/ may also hold other CPUs' wheels
  shopt -u nullglob
  if [[ ${#wheels[@]} -ne 1 ]]; then
    echo "test_wheel: expected exactly one dist/mok-*_$(uname -m).whl, found ${#wheels[@]}" \
      "(${wheels[*]:-none}); build one with 'make wheel' or set MOK_WHEEL" >&2
    exit 2
  fi
  wheel="${wheels[0]}"
fi
[[ -f "$wheel" ]] || { echo "test_wheel: no such wheel: $wheel" >&2; exit 2; }
if [[ ! -x "$locked/bin/python" ]]; then
  echo "test_wheel: no locked env at $locked (run 'make env')" >&2
  exit 2
fi

echo "test_wheel: wheel  $wheel"
echo "test_wheel: sha256 $(sha256sum "$wheel" | cut -d' ' -f1)"

"$locked/bin/python" -m venv --clear "$fresh"
site="$("$fresh/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
locked_site="$("$locked/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# Appended after the fresh env's own site-packages, so the installed mok always wins.
echo "$locked_site" > "$site/_mok_locked_deps.pth"
"$fresh/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-index \
  "$wheel"

# pytest's console script from the locked env, rebound to the fresh interpreter.
{ echo "#!$fresh/bin/python"; tail -n +2 "$locked/bin/pytest"; } > "$fresh/bin/pytest"
chmod +x "$fresh/bin/pytest"

unset PYTHONPATH
cd "$repo"
# -P: the check itself must not put the working directory (the source tree) on sys.path.
"$fresh/bin/python" -P -c '
import mok, mok.backends.cuda.extension as ext
print("test_wheel: mok", mok.__version__, "from", mok.__file__)
print("test_wheel: compiled modules for", ", ".join(ext.installed_archs()) or "no arch")
'
export MOK_EXPECT_INSTALLED=1 MOK_WHEEL="$wheel"
# No path given: pytest takes testpaths (tests/) from pyproject.toml.
exec "$fresh/bin/pytest" --import-mode=importlib -p no:cacheprovider "$@"
