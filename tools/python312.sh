#!/usr/bin/env bash
# Prints the path of a Python 3.12 interpreter: `python3.12` when it runs, else pyenv's newest
# 3.12 (pyenv's shim refuses to run a version that is installed but not selected).
set -euo pipefail
if python3.12 -c '' 2>/dev/null; then
    command -v python3.12
    exit 0
fi
if command -v pyenv >/dev/null 2>&1; then
    version=$(pyenv versions --bare | grep -E '^3\.12(\.|$)' | tail -n 1 || true)
    if [[ -n "$version" ]]; then
        echo "$(pyenv root)/versions/$version/bin/python3.12"
        exit 0
    fi
fi
echo "no Python 3.12 found: install it or run make with PYTHON=/path/to/python3.12" >&2
exit 1
