"""The one launch path of the CUDA wrappers: the kernel of the device's module, called with its
arguments plus the device's current stream (under a device guard when the device is not the
current one); and the alignment helper."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mok.backends.cuda import extension


@pytest.mark.parametrize(("current", "guard_entered"), [(0, True), (1, False)])
def test_launch_forwards_arguments_and_the_current_stream(monkeypatch, current, guard_entered):
    """The kernel gets the device's stream; the device guard is entered only when the device is
    not already the current one."""
    calls, guarded = [], []
    module = SimpleNamespace(kernel=lambda **kw: calls.append(kw) or "result")
    monkeypatch.setattr(extension, "_module_for_index", lambda index: module)

    @contextlib.contextmanager
    def guard(device):
        guarded.append(device)
        yield

    monkeypatch.setattr(torch.cuda, "device", guard)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 70 + index)
    device = torch.device("cuda", 1)
    assert extension.launch(device, "kernel", x=1, rows=2) == "result"
    assert calls == [{"x": 1, "rows": 2, "stream": 71}]
    assert guarded == ([1] if guard_entered else [])


def test_raw_stream_falls_back_to_the_stream_object(monkeypatch):
    """Where torch lacks the raw-stream query, the current stream object's handle serves."""
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    monkeypatch.setattr(
        torch.cuda, "current_stream", lambda index: SimpleNamespace(cuda_stream=77 + index)
    )
    assert extension._raw_stream(2) == 79


def test_aligned_copies_only_a_misaligned_view():
    base = torch.zeros(64, dtype=torch.uint8)
    assert extension.aligned(base).data_ptr() == base.data_ptr()
    view = base[1:17]
    fixed = extension.aligned(view)
    assert fixed.data_ptr() % extension.ALIGNMENT == 0 and torch.equal(fixed, view)


def test_the_modules_are_looked_for_in_the_mok_package():
    """The build puts mok/_C_<arch>*.so beside mok/__init__.py; the loader, now in
    mok/backends/cuda/, once looked beside itself and found none in an installed wheel."""
    import mok

    assert Path(mok.__file__).resolve().parent == extension._PACKAGE_DIR


def test_unknown_capability_names_it_and_the_carried_archs(monkeypatch):
    monkeypatch.setattr(extension, "installed_archs", lambda: ("sm_90a",))
    with pytest.raises(
        NotImplementedError, match=r"compute capability 8\.0 \(A100\).*carries: sm_90a"
    ):
        extension.module_for_capability((8, 0), "A100")


def test_missing_module_for_a_known_capability(monkeypatch):
    monkeypatch.setattr(extension, "installed_archs", lambda: ())
    with pytest.raises(NotImplementedError, match=r"10\.3.*sm_103a.*carries: none"):
        extension.module_for_capability((10, 3))


def test_predicates_are_false_without_a_gpu(monkeypatch):
    monkeypatch.setattr(extension.torch.cuda, "is_available", lambda: False)
    assert not extension.is_sm90a_supported()
    assert not extension.is_sm100a_supported()
    assert not extension.is_sm103a_supported()
