"""The one description of the CUDA extension.

Plain literal assignments only: Bazel `load()`s this file, the PEP 517 backend
(tools/build/mok_build) reads it with `ast.literal_eval`, and tests check the Nix flake, the lock
file and the Bazel targets against it. Placeholders in braces ({arch}, {module}, ...) are filled
per module by each front end with str.format, which Starlark and Python both have.
"""

# The compiler every front end must use (nvidia-cuda-nvcc on PyPI, the NVIDIA redist for Bazel,
# cudaPackages_13_0 for Nix). The PEP 517 backend refuses any other `nvcc --version`.
CUDA_VERSION = "13.0.88"

# One extension module per architecture, compiled with only that arch's -gencode so that each
# binary carries exactly one cubin: mok/_C_sm90a<EXT_SUFFIX>, ...
ARCHS = ["sm_90a", "sm_100a", "sm_103a"]

MODULE_NAMES = {
    "sm_90a": "_C_sm90a",
    "sm_100a": "_C_sm100a",
    "sm_103a": "_C_sm103a",
}

GENCODE = {
    "sm_90a": "arch=compute_90a,code=sm_90a",
    "sm_100a": "arch=compute_100a,code=sm_100a",
    "sm_103a": "arch=compute_103a,code=sm_103a",
}

# The compute capability each module serves (mok/backends/cuda/extension.py holds the same table at run time).
COMPUTE_CAPABILITY = {
    "sm_90a": "9.0",
    "sm_100a": "10.0",
    "sm_103a": "10.3",
}

EXTENSION_SOURCES = [
    "csrc/bindings.cpp",
    "csrc/comm/arrival_pull.cu",
    "csrc/comm/barrier.cu",
    "csrc/comm/combine_epilogue.cu",
    "csrc/comm/pull_push.cu",
    "csrc/experts/elementwise.cu",
    "csrc/gemm/grouped_gemm.cu",
    "csrc/gemm/sm90/k_grouped_bf16_tn.cu",
    "csrc/gemm/sm90/k_grouped_mxfp8_tn.cu",
    "csrc/gemm/sm90/m_grouped_bf16_nn_f32.cu",
    "csrc/gemm/sm90/m_grouped_bf16_nn_pair.cu",
    "csrc/gemm/sm90/m_grouped_bf16_nt.cu",
    "csrc/gemm/sm90/m_grouped_bf16_nt_swiglu.cu",
    "csrc/gemm/sm90/m_grouped_mxfp8_nt.cu",
    "csrc/gemm/sm90/m_grouped_mxfp8_nt_f16_rows.cu",
    "csrc/gemm/sm90/m_grouped_mxfp8_nt_f32.cu",
    "csrc/gemm/sm90/m_grouped_mxfp8_nt_pair.cu",
    "csrc/mxfp8/dequantize.cu",
    "csrc/mxfp8/quantize.cu",
    "csrc/mxfp8/rebase.cu",
    "csrc/schedule/schedule.cu",
]

EXTENSION_HEADERS = [
    "csrc/api/checks.hpp",
    "csrc/api/comm.hpp",
    "csrc/api/experts.hpp",
    "csrc/api/gemm.hpp",
    "csrc/api/info.hpp",
    "csrc/api/mxfp8.hpp",
    "csrc/api/schedule.hpp",
    "csrc/comm/combine_epilogue.h",
    "csrc/comm/comm.h",
    "csrc/comm/schedule_rows.cuh",
    "csrc/common/arrivals.cuh",
    "csrc/common/arrivals.hpp",
    "csrc/common/cuda_check.hpp",
    "csrc/common/fast_divide.cuh",
    "csrc/common/flags.cuh",
    "csrc/common/row_copy.cuh",
    "csrc/common/shared_memory.hpp",
    "csrc/experts/experts.h",
    "csrc/experts/swiglu_math.cuh",
    "csrc/gemm/grouped_gemm.h",
    "csrc/gemm/sm90/arrival_mainloop.cuh",
    "csrc/gemm/sm90/gate_up_mainloop.cuh",
    "csrc/gemm/sm90/grouped_kernel.cuh",
    "csrc/gemm/sm90/mx_weight_convert.cuh",
    "csrc/gemm/sm90/mx_weight_mainloop.cuh",
    "csrc/gemm/sm90/mx_weight_steps.cuh",
    "csrc/gemm/sm90/on_demand_scheduler.cuh",
    "csrc/gemm/sm90/paired_mainloop.cuh",
    "csrc/gemm/sm90/producer_loads.cuh",
    "csrc/gemm/sm90/swiglu_epilogue.cuh",
    "csrc/gemm/sm90/tables.cuh",
    "csrc/mxfp8/format.hpp",
    "csrc/mxfp8/math.cuh",
    "csrc/mxfp8/mxfp8.h",
    "csrc/mxfp8/quantize_sources.cuh",
    "csrc/mxfp8/quantize_tile.cuh",
    "csrc/mxfp8/round.cuh",
    "csrc/schedule/schedule.h",
]

# Relative to the repository root; sources include "common/...", "gemm/sm90/...", ...
INCLUDE_DIRS = ["csrc"]

# Compile definitions for every source of a module.
DEFINES = [
    "MOK_MODULE_NAME={module}",
    "MOK_ARCH=\"{arch}\"",
    # MOK_ARCH_sm_90a, ...: lets a source compile arch-specific code (the wgmma GEMMs) or not.
    "MOK_ARCH_{arch}",
    # Without NDEBUG, CUTLASS's device asserts are calls that serialize the wgmma pipeline.
    "NDEBUG",
    "MOK_VERSION=\"{version}\"",
    "MOK_NVCC_VERSION=\"{nvcc_version}\"",
    "MOK_GIT_COMMIT=\"{git_commit}\"",
]

# nvcc flags for every source (.cu and .cpp). -ftz=false and -prec-div=true are the defaults but
# are spelled out: the quantize kernel matches the reference bit for bit only without
# flush-to-zero (2^-127 scale factors are fp32 subnormals).
NVCC_FLAGS = [
    "-std=c++17",
    "-O3",
    "-ftz=false",
    "-prec-div=true",
    "-prec-sqrt=true",
]

# Host compiler flags (passed with -Xcompiler). -g0: no debug info, hence no paths in it.
HOST_FLAGS = [
    "-fPIC",
    "-fvisibility=hidden",
    "-g0",
    "-Wall",
]

# Flags that make a build independent of where it runs; {src_root} and {build_root} are the
# absolute source and output directories, {source} the source path relative to the root.
# -objtemp keeps nvcc's intermediate files next to the object, -frandom-seed fixes the names
# nvcc and gcc would otherwise draw at random, the prefix maps strip absolute paths from __FILE__.
REPRODUCIBLE_FLAGS = [
    "-objtemp",
    "-frandom-seed={source}:{arch}",
    "-Xcompiler=-ffile-prefix-map={src_root}=.",
    "-Xcompiler=-ffile-prefix-map={build_root}=build",
]

# Link with the host compiler, not nvcc: nothing is compiled with -rdc, so no device link step is
# needed, and nvcc's would add an empty sm_75 cubin to every module. The CUDA runtime is linked
# statically: importing a module needs only the driver, never a libcudart.so.
LINK_FLAGS = [
    "-shared",
    "-Wl,--build-id=sha1",
    "-Wl,-z,noexecstack",
]

LINK_LIBS = [
    "-l:libcudart_static.a",
    "-lrt",
    "-lpthread",
    "-ldl",
]

# The host CPUs wheels are built for (the names `uname -m` and wheel tags use): x86_64 hosts and
# aarch64 Grace hosts (GH200, GB200/GB300 NVL72). Both are built on x86_64: aarch64 by cross-compiling.
HOST_CPUS = ["x86_64", "aarch64"]

# The host C++ compiler nvcc runs (-ccbin) and the link step uses, per target CPU: Debian 12's GCC
# 12.2.0, native and cross (packages g++-12 and g++-12-aarch64-linux-gnu; CI pins the Debian image
# by digest). The PEP 517 backend refuses any other version. zig c++ (PyPI ziglang) was tried and
# is refused by nvcc 13.0 itself: it is clang 21 with libc++, and host_config.h accepts clang < 21,
# host_defines.h no libc++ on x86.
HOST_COMPILER_VERSION = "12.2.0"

HOST_COMPILERS = {
    "x86_64": "x86_64-linux-gnu-g++-12",
    "aarch64": "aarch64-linux-gnu-g++-12",
}

# The wheels' platform tags. The modules are linked against Debian 12 (glibc 2.36, GCC 12): the
# static CUDA runtime binds pthread/dl symbols at GLIBC_2.34, so 2_34 is the honest tag;
# tools/check_wheel.py has auditwheel confirm it for every wheel.
WHEEL_PLATFORMS = {
    "x86_64": "manylinux_2_34_x86_64",
    "aarch64": "manylinux_2_34_aarch64",
}
