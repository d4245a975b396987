"""The one description of the CUDA extension.

Plain literal assignments only: Bazel `load()`s this file, the PEP 517 backend reads it with
`ast.literal_eval`, and a test checks the Nix flake and the lock file against it.
"""

# The compiler every front end must use (nvidia-cuda-nvcc on PyPI, the NVIDIA redist for Bazel,
# cudaPackages_13_0 for Nix).
CUDA_VERSION = "13.0.88"

# One extension module per architecture: mok/_C_<arch>.so
ARCHS = ["sm_90a", "sm_100a", "sm_103a"]

EXTENSION_SOURCES = [
    "csrc/bindings.cpp",
    "csrc/mxfp8.cu",
]
