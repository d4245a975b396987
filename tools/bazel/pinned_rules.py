"""What the Bazel files may load and call, for evaluating them with stubs (starlark_eval.py).

Only names: which attributes a rule takes, which labels exist and which repositories are visible
is checked by `bazel build --nobuild` on a runner (ci.yml), which reads the real rule sets. A
file that loads a symbol not listed here fails the evaluation, so a new rule is added here once.
"""

from __future__ import annotations

# The CUDA redistributable releases we may pin, with the cuda_nvcc / cuda_cudart / cuda_cccl
# versions their redistrib JSON lists (read from the copy of redistrib_13.0.2.json kept in
# NixOS/nixpkgs pkgs/development/cuda-modules/_cuda/manifests/cuda/; the JSON's sha256
# fce66717...d71c2 is the one google-ml-infra/rules_ml_toolchain gpu/cuda/cuda_redist_versions.bzl
# records for redistrib_13.0.2.json).
CUDA_REDIST_COMPONENTS = {
    "13.0.2": {"cuda_nvcc": "13.0.88", "cuda_cudart": "13.0.96", "cuda_cccl": "13.0.85"},
}

# rules_cuda 0.3.0 cuda/private/templates/registry.bzl FULL_COMPONENT_NAME keys.
CUDA_COMPONENTS = frozenset(
    [
        "cudart",
        "nvcc",
        "nvvm",
        "cccl",
        "crt",
        "culibos",
        "cublas",
        "cufft",
        "cufile",
        "cupti",
        "curand",
        "cusolver",
        "cusparse",
        "npp",
        "nvidia_fs",
        "nvjitlink",
        "nvjpeg",
        "nvml",
        "nvrtc",
        "nvtx",
    ]
)

# (bzl file, symbol) of every rule or macro a Bazel file may load -> the release it comes from.
RULES: dict[tuple[str, str], str] = {
    ("@rules_python//python:py_library.bzl", "py_library"): "rules_python 2.3.2",
    ("@rules_python//python:py_test.bzl", "py_test"): "rules_python 2.3.2",
    ("@rules_python//python:packaging.bzl", "py_package"): "rules_python 2.3.2",
    ("@rules_python//python:packaging.bzl", "py_wheel"): "rules_python 2.3.2",
    ("@rules_cc//cc:cc_library.bzl", "cc_library"): "rules_cc 0.2.17",
    ("@rules_cuda//cuda:defs.bzl", "cuda_library"): "rules_cuda 0.3.0",
    ("@pybind11_bazel//:build_defs.bzl", "pybind_extension"): "pybind11_bazel 3.0.1",
    ("@pybind11_bazel//:build_defs.bzl", "pybind_library"): "pybind11_bazel 3.0.1",
    ("@bazel_skylib//rules:common_settings.bzl", "bool_flag"): "bazel_skylib 1.9.2",
    ("@buildifier_prebuilt//:rules.bzl", "buildifier"): "buildifier_prebuilt 8.2.1.2",
}

# Values (not rules) a Bazel file may load: bazel_skylib's `paths` struct.
VALUES = {
    ("@bazel_skylib//lib:paths.bzl", "paths"): "bazel_skylib 1.9.2 lib/paths.bzl",
}

# Functions Bazel itself gives BUILD files (and macros as native.*).
NATIVE = frozenset(
    {"package", "exports_files", "filegroup", "alias", "config_setting", "test_suite"}
)

# MODULE.bazel globals.
MODULE_FUNCTIONS = frozenset({"module", "bazel_dep", "register_toolchains"})

# Module extensions: (bzl file, extension name) -> its tag classes.
EXTENSIONS: dict[tuple[str, str], frozenset[str]] = {
    ("@rules_python//python/extensions:python.bzl", "python"): frozenset({"defaults", "toolchain"}),
    ("@rules_python//python/extensions:pip.bzl", "pip"): frozenset({"parse", "whl_mods"}),
    ("@rules_cuda//cuda:extensions.bzl", "toolchain"): frozenset(
        {"redist_json", "toolkit", "component"}
    ),
}
