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

def _pytest_file_test(src, args, data, deps, name = None, **kwargs):
    # One py_test that runs pytest (through the shared runner) on one test file.
    py_test(
        name = name or _name(src),
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

# Linux on either host CPU: x86_64 (H100/H200 hosts) or aarch64 (Grace: GH200, GB200/GB300 NVL72).
def _linux_x86_64_or_aarch64():
    return select({
        "@platforms//cpu:aarch64": ["@platforms//os:linux"],
        "@platforms//cpu:x86_64": ["@platforms//os:linux"],
        "//conditions:default": ["@platforms//:incompatible"],
    })

# The wheel a GPU test installs: //:mok_wheel, or nothing with --config=release_wheel, where
# pytest_main.py takes the file named by MOK_WHEEL (the release artifact) and checks its SHA-256.
def _wheel_data():
    return select({
        "//tests:release_wheel": [],
        "//conditions:default": [_WHEEL],
    })

def _wheel_args():
    return select({
        "//tests:release_wheel": [],
        "//conditions:default": ["--wheel=$(rootpath %s)" % _WHEEL],
    })

# How each GPU variant starts: one process, torchrun over the host's GPUs, or torchrun over the
# trays of an NVL72 rack (pytest_main.py --launch=...).
_VARIANTS = {
    "": ("one", ["gpu"]),
    "_multi_gpu": ("host", ["gpu", "multi-gpu"]),
    "_nvl72": ("rack", ["gpu", "nvl72"]),
}

def _gpu_test(src, suffix, extra_data, size):
    launch, tags = _VARIANTS[suffix]
    _pytest_file_test(
        src,
        name = _name(src) + suffix,
        args = ["--require-wheel", "--launch=" + launch] + _wheel_args(),
        data = _wheel_data() + extra_data.get(src, []),
        deps = [],
        size = size,
        tags = tags + _GPU_EXECUTION,
        target_compatible_with = _linux_x86_64_or_aarch64(),
    )

def mok_gpu_tests(multi_gpu = [], nvl72 = [], extra_data = {}, size = "large"):
    """py_tests for every tests/gpu/test_*.py, importing mok from the built wheel only.

    Every file gets a one-process target (tag gpu: one GPU, multi-rank paths as ranks in one
    process). Files in `multi_gpu` also get <name>_multi_gpu (tag multi-gpu: torchrun, one rank
    per visible GPU), files in `nvl72` also get <name>_nvl72 (tag nvl72: torchrun across a rack).

    Args:
      multi_gpu: file names that also run with one process per GPU of the host.
      nvl72: file names that also run across a whole NVL72 NVLink domain (EP 8 to 72).
      extra_data: file name -> extra data labels that test reads.
      size: Bazel test size of every test.
    """
    _support_library()
    for src in _test_files():
        _gpu_test(src, "", extra_data, size)
        if src in multi_gpu:
            _gpu_test(src, "_multi_gpu", extra_data, size)
        if src in nvl72:
            _gpu_test(src, "_nvl72", extra_data, size)
