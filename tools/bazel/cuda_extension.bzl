"""One extension module per GPU architecture, from the single description in tools/build.

Sources, architectures and the compiler version are read from //tools/build:extension.bzl (the
file the PEP 517 backend also reads), so Bazel cannot drift from the other front ends.
"""

load("@pybind11_bazel//:build_defs.bzl", "pybind_extension")
load("@rules_cuda//cuda:defs.bzl", "cuda_library")
load("//tools/bazel:version.bzl", "VERSION")
load("//tools/build:extension.bzl", "ARCHS", "CUDA_VERSION", "EXTENSION_SOURCES")

# The sources live in the //csrc package; its BUILD file exports them and the header library.
_SRC_PACKAGE = "csrc/"
_HEADERS = "//csrc:headers"

def module_name(arch):
    """Python module name of an architecture's extension: "sm_90a" -> "_C_sm90a"."""
    return "_C_" + arch.replace("_", "")

def _arch_spec(arch):
    # rules_cuda's per-target arch spec "compute_90a:sm_90a" becomes
    # -gencode arch=compute_90a,code=sm_90a: a cubin for this architecture and nothing else.
    number = arch[len("sm_"):]
    return "compute_{n}:sm_{n}".format(n = number)

def _labels(suffix):
    return ["//csrc:" + src[len(_SRC_PACKAGE):] for src in EXTENSION_SOURCES if src.endswith(suffix)]

def _defines(arch):
    # The binding reads these to name the module and report what built it (csrc/api/info.hpp).
    return [
        "MOK_MODULE_NAME=" + module_name(arch),
        "MOK_ARCH=\"%s\"" % arch,
        "MOK_NVCC_VERSION=\"%s\"" % CUDA_VERSION,
        "MOK_VERSION=\"%s\"" % VERSION,
    ]

def mok_cuda_extensions(visibility = None):
    """Declares, for every arch in ARCHS, the device code library and the pybind11 module.

    Args:
      visibility: visibility of the extension modules.
    """
    for arch in ARCHS:
        name = module_name(arch)
        cuda_library(
            name = name + "_device",
            srcs = _labels(".cu"),
            deps = [_HEADERS],
            archs = [_arch_spec(arch)],
            local_defines = _defines(arch),
            target_compatible_with = [
                "@platforms//os:linux",
                "@platforms//cpu:x86_64",
            ],
        )
        pybind_extension(
            name = name,
            srcs = _labels(".cpp"),
            deps = [
                ":" + name + "_device",
                _HEADERS,
            ],
            local_defines = _defines(arch),
            visibility = visibility,
        )

def extension_modules():
    """Labels of every architecture's module, for the package's data and the wheel."""
    return [":" + module_name(arch) for arch in ARCHS]
