"""Which compiled extension module serves which GPU.

The wheel carries one module per architecture (tools/build/extension.bzl, MODULE_NAMES), each
with only that architecture's cubin. This module maps a device's compute capability to its module
and says clearly when the installation has none for it. Nothing here needs a GPU to import.

| capability | arch    | module         |
|------------|---------|----------------|
| 9.0        | sm_90a  | mok._C_sm90a   |
| 10.0       | sm_100a | mok._C_sm100a  |
| 10.3       | sm_103a | mok._C_sm103a  |
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
from pathlib import Path
from types import ModuleType

import torch

# The same tables as extension.bzl (COMPUTE_CAPABILITY, MODULE_NAMES); a test keeps them equal.
ARCH_BY_CAPABILITY: dict[tuple[int, int], str] = {
    (9, 0): "sm_90a",
    (10, 0): "sm_100a",
    (10, 3): "sm_103a",
}
MODULE_NAMES: dict[str, str] = {
    "sm_90a": "_C_sm90a",
    "sm_100a": "_C_sm100a",
    "sm_103a": "_C_sm103a",
}

# The mok package's folder (this file sits in mok/backends/cuda/): the build puts the modules there.
_PACKAGE_DIR = Path(__file__).resolve().parents[2]


@functools.cache
def installed_archs() -> tuple[str, ...]:
    """Architectures whose module file is present in this installation (checked on disk once:
    the backend asks on every call)."""
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    return tuple(
        arch
        for arch, module in MODULE_NAMES.items()
        if any((_PACKAGE_DIR / f"{module}{suffix}").is_file() for suffix in suffixes)
    )


def arch_for_capability(capability: tuple[int, int]) -> str | None:
    """The architecture compiled for this exact compute capability, or None."""
    return ARCH_BY_CAPABILITY.get(tuple(capability))


def _carried() -> str:
    archs = installed_archs()
    if not archs:
        return "none (no compiled module: install the mok wheel, or build one with `make wheel`)"
    return ", ".join(archs)


@functools.cache
def load_arch(arch: str) -> ModuleType:
    """Import the module of one architecture (ImportError names the missing file)."""
    if arch not in MODULE_NAMES:
        raise NotImplementedError(f"mok has no module for {arch!r}; known: {list(MODULE_NAMES)}")
    return importlib.import_module(f"mok.{MODULE_NAMES[arch]}")


def module_for_capability(capability: tuple[int, int], device_name: str = "") -> ModuleType:
    """The module serving `capability`, or NotImplementedError naming it and what is installed."""
    major, minor = capability
    arch = arch_for_capability(capability)
    what = f"compute capability {major}.{minor}" + (f" ({device_name})" if device_name else "")
    if arch is None:
        raise NotImplementedError(
            f"mok has no CUDA kernels for {what}; it is built for "
            f"{', '.join(f'{a} ({c[0]}.{c[1]})' for c, a in ARCH_BY_CAPABILITY.items())} "
            f"and this installation carries: {_carried()}"
        )
    if arch not in installed_archs():
        raise NotImplementedError(
            f"mok's CUDA module for {what} ({arch}) is not in this installation; "
            f"it carries: {_carried()}"
        )
    return load_arch(arch)


def module_for_device(device: torch.device | int | str | None = None) -> ModuleType:
    """The module for a CUDA device (default: the current one)."""
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    device = torch.device(device)
    if device.type != "cuda":
        raise NotImplementedError(f"mok's CUDA kernels need a CUDA device, got {device}")
    index = torch.cuda.current_device() if device.index is None else device.index
    return _module_for_index(index)


@functools.cache
def _module_for_index(index: int) -> ModuleType:
    # Cached: every kernel launch asks. A failure raises and is not cached.
    capability = torch.cuda.get_device_capability(index)
    return module_for_capability(capability, torch.cuda.get_device_name(index))


def _device_has(arch: str, device: torch.device | int | str | None) -> bool:
    if not torch.cuda.is_available() or arch not in installed_archs():
        return False
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else device
    device = torch.device(device)
    if device.type != "cuda":
        return False
    return arch_for_capability(torch.cuda.get_device_capability(device)) == arch


def is_sm90a_supported(device: torch.device | int | str | None = None) -> bool:
    """A Hopper (9.0) device and the sm_90a module are both present."""
    return _device_has("sm_90a", device)


def is_sm100a_supported(device: torch.device | int | str | None = None) -> bool:
    """A Blackwell B200/GB200 (10.0) device and the sm_100a module are both present."""
    return _device_has("sm_100a", device)


def is_sm103a_supported(device: torch.device | int | str | None = None) -> bool:
    """A Blackwell B300/GB300 (10.3) device and the sm_103a module are both present."""
    return _device_has("sm_103a", device)


def is_supported(device: torch.device | int | str | None = None) -> bool:
    """Some installed module has kernels for this device."""
    return any(_device_has(arch, device) for arch in MODULE_NAMES)


# The kernels move data in 16-byte vectors where the sizes allow.
ALIGNMENT = 16


def address(t: torch.Tensor | None) -> int:
    """`t`'s device address as the kernels take it; 0 for None (an operand or output the
    kernel goes without)."""
    return 0 if t is None else t.data_ptr()


def aligned(x: torch.Tensor) -> torch.Tensor:
    """`x` contiguous and 16-byte aligned (a contiguous view can start mid-allocation: copy it)."""
    x = x.contiguous()
    return x if x.data_ptr() % ALIGNMENT == 0 else x.clone()


def launch(device: torch.device, kernel: str, **arguments):
    """Call `kernel` of the module serving `device` on that device's current stream.

    The extension takes raw addresses and a cudaStream_t as integers (no torch headers), so the
    device guard and the stream are supplied here, once for every wrapper. Every kernel launch
    of a step passes through here on the host's critical path, so the common case (a CUDA
    device with an index) takes the cached module and torch's raw-stream query (what its
    compiled kernels use) instead of building torch.device and torch.cuda.Stream objects.
    """
    if device.type == "cuda" and device.index is not None:
        index = device.index
        module = _module_for_index(index)
    else:
        module = module_for_device(device)  # NotImplementedError for a non-CUDA device
        index = torch.cuda.current_device()
    if index == torch.cuda.current_device():  # the common case: no guard to enter
        return getattr(module, kernel)(stream=_raw_stream(index), **arguments)
    with torch.cuda.device(index):
        return getattr(module, kernel)(stream=_raw_stream(index), **arguments)


def _raw_stream(index: int) -> int:
    """The cudaStream_t of the current stream of CUDA device `index`, as an int."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw(index)
    return torch.cuda.current_stream(index).cuda_stream
