"""One extension module per GPU architecture, from the single description in tools/build.

Sources, headers, architectures, defines and nvcc / host / link flags are all read from
//tools/build:extension.bzl, the file the PEP 517 backend also reads, and every source is compiled
by nvcc as the backend does: one cuda_library per (source, architecture), linked by the host
toolchain into mok/_C_<arch>.so. Nothing here restates the description.
"""

load("@pybind11_bazel//:build_defs.bzl", "pybind_extension", "pybind_library")
load("@rules_cuda//cuda:defs.bzl", "cuda_library")
load("//tools/bazel:version.bzl", "VERSION")
load(
    "//tools/build:extension.bzl",
    "ARCHS",
    "CUDA_VERSION",
    "DEFINES",
    "EXTENSION_SOURCES",
    "GENCODE",
    "HOST_FLAGS",
    "LINK_FLAGS",
    "MODULE_NAMES",
    "NVCC_FLAGS",
    "REPRODUCIBLE_FLAGS",
)

# The sources live in the //csrc package, which exports them and the header library.
_SRC_PACKAGE = "csrc/"
_HEADERS = "//csrc:headers"
_PYBIND11 = "pybind11_headers"

# CUTLASS/CuTe headers from the locked nvidia-cutlass wheel (MODULE.bazel adds the target).
_CUTLASS = "@pypi//nvidia_cutlass:cutlass_headers"

# Bazel compiles in its execution root with relative paths, so the prefix maps find nothing
# absolute to strip; they stay so the flag set is the one the other front ends use. Bazel never
# stamps, so no commit is compiled in (the binding's own default word).
_UNSTAMPED = {"build_root": "bazel-out", "git_commit": "unknown", "src_root": "."}

def _arch_spec(arch):
    # GENCODE "arch=compute_90a,code=sm_90a" is rules_cuda's per-target spec "compute_90a:sm_90a",
    # which it turns back into the same -gencode: one cubin, this architecture only.
    fields = dict([item.split("=") for item in GENCODE[arch].split(",")])
    return fields["arch"] + ":" + fields["code"]

def _fill(templates, arch, source):
    values = dict(
        _UNSTAMPED,
        arch = arch,
        module = MODULE_NAMES[arch],
        nvcc_version = CUDA_VERSION,
        source = source,
        version = VERSION,
    )
    return [template.format(**values) for template in templates]

def _label(source):
    return "//csrc:" + source[len(_SRC_PACKAGE):]

def _object_name(arch, source):
    stem = source[len(_SRC_PACKAGE):].replace("/", "_").replace(".", "_")
    return MODULE_NAMES[arch] + "_" + stem

def _module(arch, visibility):
    objects = []
    for source in EXTENSION_SOURCES:
        objects.append(":" + _object_name(arch, source))
        cuda_library(
            name = _object_name(arch, source),
            srcs = [_label(source)],
            # The module's init function is reached only through Python's dlsym, so the linker
            # must keep every object.
            alwayslink = True,
            archs = [_arch_spec(arch)],
            copts = NVCC_FLAGS + _fill(REPRODUCIBLE_FLAGS, arch, source),
            host_copts = HOST_FLAGS,
            local_defines = _fill(DEFINES, arch, source),
            target_compatible_with = [
                "@platforms//os:linux",
                "@platforms//cpu:x86_64",
            ],
            deps = [
                _HEADERS,
                _CUTLASS,
                ":" + _PYBIND11,
            ],
        )

    # pybind_extension links with -shared itself (linkshared = 1).
    pybind_extension(
        name = MODULE_NAMES[arch],
        linkopts = [flag for flag in LINK_FLAGS if flag != "-shared"],
        visibility = visibility,
        deps = objects,
    )

def mok_cuda_extensions(visibility = None):
    """Declares mok/_C_<arch>.so for every arch in ARCHS, with its per-source device objects.

    Args:
      visibility: visibility of the extension modules.
    """

    # pybind11's and Python's headers for the nvcc-compiled binding, as pybind11_bazel provides them.
    pybind_library(name = _PYBIND11)
    for arch in ARCHS:
        _module(arch, visibility)

def extension_modules():
    """Labels of every architecture's module, for the package's data and the wheel."""
    return [":" + MODULE_NAMES[arch] for arch in ARCHS]
