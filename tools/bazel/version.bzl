"""The version Bazel gives the wheel and compiles into the extension modules.

pyproject.toml carries the same string; tests/cpu/test_bazel_files.py fails when they differ.
"""

VERSION = "0.1.0"
