"""One py_test per test file, so a new tests/<tier>/test_*.py runs without editing a BUILD file.

Every test runs pytest on its own file through //tools/bazel:pytest_main.py with the project's
pytest configuration (pyproject.toml). CPU tests import mok from the source package; GPU tests get
only the built wheel, so they test exactly the artifact that ships.
"""

load("@bazel_skylib//lib:paths.bzl", "paths")
load("@rules_python//python:py_library.bzl", "py_library")
load("@rules_python//python:py_test.bzl", "py_test")

_RUNNER = "//tools/bazel:pytest_main.py"
_WHEEL = "//:mok_wheel"
_THIRD_PARTY = [
    "@pypi//hypothesis",
    "@pypi//numpy",
    "@pypi//pytest",
    "@pypi//torch",
]

# No generated __init__.py files: the runfiles tree then imports exactly like the source tree.
_NO_INIT = 0

# Bazel recognises "exclusive" (no other test runs alongside) and "local" (no sandbox: the
# sandbox's /dev has no /dev/nvidia* nodes, so CUDA would see no device).
_GPU_EXECUTION = ["exclusive", "local"]

def _support_library():
    # Non-test modules of the directory (conftest.py, helpers) that the tests import.
    py_library(
        name = "support",
        srcs = native.glob(["*.py"], exclude = ["test_*.py"], allow_empty = True),
        deps = ["//tests:support"],
    )

def _test_files():
    return native.glob(["test_*.py"], allow_empty = True)

def _name(src):
    return paths.split_extension(src)[0]

def _pytest_file_test(src, args, data, deps, **kwargs):
    # One py_test that runs pytest (through the shared runner) on one test file.
    py_test(
        name = _name(src),
        srcs = [src, _RUNNER],
        main = _RUNNER,
        args = args + ["$(rootpath :%s)" % src],
        data = ["//:pyproject.toml"] + data,
        legacy_create_init = _NO_INIT,
        deps = [":support"] + deps + _THIRD_PARTY,
        **kwargs
    )

def mok_cpu_tests(extra_data = {}, size = "medium"):
    """A py_test for every tests/cpu/test_*.py, importing mok from source.

    Args:
      extra_data: file name -> extra data labels that test reads.
      size: Bazel test size of every test.
    """
    _support_library()
    for src in _test_files():
        _pytest_file_test(
            src,
            args = [],
            data = extra_data.get(src, []),
            deps = ["//mok"],
            size = size,
            tags = ["cpu"],
        )

def _gpu_tags(src, multi_gpu, nvl72):
    tags = ["gpu"] + _GPU_EXECUTION
    if src in multi_gpu or "multi_gpu" in src:
        tags.append("multi-gpu")
    if src in nvl72 or "nvl72" in src:
        tags.append("nvl72")
    return tags

def mok_gpu_tests(multi_gpu = [], nvl72 = [], extra_data = {}, size = "large"):
    """A py_test for every tests/gpu/test_*.py, importing mok from the built wheel only.

    Args:
      multi_gpu: file names that need two or more GPUs (also implied by "multi_gpu" in the name).
      nvl72: file names that need an NVL72 NVLink domain (also implied by "nvl72" in the name).
      extra_data: file name -> extra data labels that test reads.
      size: Bazel test size of every test.
    """
    _support_library()
    for src in _test_files():
        _pytest_file_test(
            src,
            args = ["--wheel=$(rootpath %s)" % _WHEEL],
            data = [_WHEEL] + extra_data.get(src, []),
            deps = [],
            size = size,
            tags = _gpu_tags(src, multi_gpu, nvl72),
            target_compatible_with = [
                "@platforms//os:linux",
                "@platforms//cpu:x86_64",
            ],
        )
