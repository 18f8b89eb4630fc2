"""Block.__cuda_array_interface__, __dlpack__ and __dlpack_device__.

On sim the three refuse with HostMemoryError (an AttributeError, so hasattr
of the interface is False). The CUDA code paths run here too, over a sim
runtime told it is CUDA (`_as_cuda`): sim memory is host memory, so the
capsule's pointer can be read back. The GPU tests (CuPy and PyTorch over
one block) skip without a CUDA backend.
"""

from __future__ import annotations

import ctypes
import gc
import weakref

import pytest

import xlog_cuda as xc
from xlog_cuda import _runtime as rtmod

_PyCapsule_SetName = ctypes.pythonapi.PyCapsule_SetName
_PyCapsule_SetName.restype = ctypes.c_int
_PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_PyCapsule_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = ctypes.c_void_p
_PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_PyCapsule_IsValid = ctypes.pythonapi.PyCapsule_IsValid
_PyCapsule_IsValid.restype = ctypes.c_int
_PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _managed(capsule) -> rtmod.DLManagedTensor:
    address = _PyCapsule_GetPointer(capsule, b"dltensor")
    return rtmod.DLManagedTensor.from_address(address)


def _consume(capsule) -> None:
    """What a consumer does: take the tensor, rename the capsule, and call
    the deleter when its own tensor goes away."""
    managed = _managed(capsule)
    assert _PyCapsule_SetName(capsule, b"used_dltensor") == 0
    managed.deleter(ctypes.addressof(managed))


class _Kept:
    pass


@pytest.fixture
def sim_block(make_runtime):
    rt = make_runtime()
    stream = rt.acquire_stream()
    block = rt.allocate(64, stream, tag="view")
    return rt, stream, block


def _as_cuda(rt):
    """The CUDA code paths over sim memory (host memory the test can read)."""
    rt._backend = "cuda"


# -- sim: refused ------------------------------------------------------------


def test_sim_cuda_array_interface_is_absent(sim_block):
    _, _, block = sim_block
    assert not hasattr(block, "__cuda_array_interface__")
    with pytest.raises(xc.HostMemoryError, match="host memory") as info:
        block.__cuda_array_interface__
    assert isinstance(info.value, xc.InvalidArgumentError)
    assert isinstance(info.value, AttributeError)
    assert info.value.status == xc.Status.INVALID_ARGUMENT


def test_sim_dlpack_refused(sim_block):
    _, _, block = sim_block
    with pytest.raises(xc.HostMemoryError, match="sim backend"):
        block.__dlpack_device__()
    with pytest.raises(xc.HostMemoryError, match="sim backend"):
        block.__dlpack__()
    with pytest.raises(xc.HostMemoryError):
        block.__dlpack__(stream=None)
    assert rtmod.dlpack_views() == 0


# -- the DLManagedTensor and capsule, with a fake pointer --------------------


def test_struct_layout_matches_dlpack_h():
    # dlpack.h on LP64: DLDevice 8, DLDataType 4, DLTensor 48, DLManagedTensor 64.
    assert ctypes.sizeof(rtmod.DLDevice) == 8
    assert ctypes.sizeof(rtmod.DLDataType) == 4
    assert ctypes.sizeof(rtmod.DLTensor) == 48
    assert rtmod.DLTensor.byte_offset.offset == 40
    assert ctypes.sizeof(rtmod.DLManagedTensor) == 64
    assert rtmod.DLManagedTensor.deleter.offset == 56


def test_capsule_fields_with_fake_pointer():
    kept = _Kept()
    capsule = rtmod._dlpack_capsule(kept, 0xDEAD0000, 4096, rtmod.KDL_CUDA, 3)
    assert _PyCapsule_IsValid(capsule, b"dltensor") == 1
    tensor = _managed(capsule).dl_tensor
    assert tensor.data == 0xDEAD0000
    assert (tensor.device.device_type, tensor.device.device_id) == (2, 3)
    assert tensor.ndim == 1
    assert (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes) == (1, 8, 1)
    assert tensor.shape[0] == 4096
    assert not tensor.strides
    assert tensor.byte_offset == 0
    assert _managed(capsule).manager_ctx is None
    _consume(capsule)


def test_unconsumed_capsule_drops_its_reference():
    kept = _Kept()
    gone = weakref.ref(kept)
    before = rtmod.dlpack_views()
    capsule = rtmod._dlpack_capsule(kept, 0x1000, 8, rtmod.KDL_CUDA, 0)
    del kept
    gc.collect()
    assert gone() is not None, "the view must keep its object alive"
    assert rtmod.dlpack_views() == before + 1
    del capsule  # never consumed: its destructor calls the deleter
    gc.collect()
    assert gone() is None
    assert rtmod.dlpack_views() == before


def test_consumed_capsule_deleter_drops_reference_once():
    kept = _Kept()
    gone = weakref.ref(kept)
    before = rtmod.dlpack_views()
    capsule = rtmod._dlpack_capsule(kept, 0x1000, 8, rtmod.KDL_CUDA, 0)
    del kept
    _consume(capsule)  # the consumer's tensor died: deleter called
    gc.collect()
    assert gone() is None
    assert rtmod.dlpack_views() == before
    del capsule  # renamed: the destructor leaves it alone
    gc.collect()
    assert rtmod.dlpack_views() == before


def test_zero_byte_view_has_null_data():
    capsule = rtmod._dlpack_capsule(_Kept(), 0, 0, rtmod.KDL_CUDA, 0)
    tensor = _managed(capsule).dl_tensor
    assert tensor.data is None and tensor.shape[0] == 0
    del capsule
    gc.collect()


# -- the CUDA code paths over sim memory -------------------------------------


def test_cuda_array_interface_fields(sim_block):
    rt, stream, block = sim_block
    _as_cuda(rt)
    cai = block.__cuda_array_interface__
    assert hasattr(block, "__cuda_array_interface__")
    assert cai["shape"] == (64,)
    assert cai["typestr"] == "|u1"
    assert cai["data"] == (block.ptr, False)
    assert cai["strides"] is None
    assert cai["version"] == 3
    assert cai["stream"] == stream.native and cai["stream"] not in (0, None)


def test_cuda_array_interface_of_freed_block(sim_block):
    rt, _, block = sim_block
    block.free()
    _as_cuda(rt)
    with pytest.raises(xc.UseAfterFreeError):
        block.__cuda_array_interface__


def test_dlpack_over_block(sim_block):
    rt, stream, block = sim_block
    block.write(bytes(range(64)))
    _as_cuda(rt)
    assert block.__dlpack_device__() == (2, block.device)
    consumer = rt.acquire_stream()
    capsule = block.__dlpack__(stream=consumer.native)
    tensor = _managed(capsule).dl_tensor
    assert tensor.data == block.ptr
    assert tensor.shape[0] == 64
    assert (tensor.device.device_type, tensor.device.device_id) == (2, block.device)
    # sim memory is host memory: the view really is the block's bytes
    assert ctypes.string_at(tensor.data, 64) == bytes(range(64))
    _consume(capsule)


@pytest.mark.parametrize("stream", [None, 1, 2, -1])
def test_dlpack_stream_values(sim_block, stream):
    rt, _, block = sim_block
    _as_cuda(rt)
    capsule = block.__dlpack__(stream=stream)
    _consume(capsule)


@pytest.mark.parametrize("stream", [0, -2, "1", 1.0])
def test_dlpack_bad_stream(sim_block, stream):
    rt, _, block = sim_block
    _as_cuda(rt)
    before = rtmod.dlpack_views()
    with pytest.raises(xc.InvalidArgumentError):
        block.__dlpack__(stream=stream)
    assert rtmod.dlpack_views() == before


def test_dlpack_refuses_copy_and_other_device(sim_block):
    rt, _, block = sim_block
    _as_cuda(rt)
    with pytest.raises(BufferError):
        block.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        block.__dlpack__(dl_device=(1, 0))
    capsule = block.__dlpack__(max_version=(1, 0), dl_device=(2, block.device), copy=False)
    _consume(capsule)


def test_dlpack_of_freed_block(sim_block):
    rt, _, block = sim_block
    block.free()
    _as_cuda(rt)
    with pytest.raises(xc.UseAfterFreeError):
        block.__dlpack__(stream=-1)
    with pytest.raises(xc.UseAfterFreeError):
        block.__dlpack__()


def test_view_keeps_block_alive(make_runtime):
    rt = make_runtime()
    stream = rt.acquire_stream()
    block = rt.allocate(64, stream)
    _as_cuda(rt)
    capsule = block.__dlpack__(stream=-1)
    gone = weakref.ref(block)
    del block
    gc.collect()
    assert gone() is not None
    assert rt.stats().live_blocks == 1
    del capsule
    gc.collect()
    assert gone() is None
    assert rt.stats().live_blocks == 0


# -- GPU: CuPy and PyTorch over one xlog block -------------------------------


@pytest.fixture
def cuda_runtime():
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    try:
        rt = xc.Runtime(0, xc.Config(backend="cuda"))
    except xc.XlogError as e:
        pytest.skip(f"no CUDA backend: {e}")
    if rt.backend != "cuda":
        rt.close()
        pytest.skip("no CUDA backend")
    if not torch.cuda.is_available():
        rt.close()
        pytest.skip("PyTorch sees no CUDA device")
    yield rt, cupy, torch
    rt.close()


def test_cupy_writes_torch_reads(cuda_runtime):
    rt, cupy, torch = cuda_runtime
    n = 1 << 20
    with rt.acquire_stream() as stream:
        block = rt.allocate(n, stream, tag="shared")
        a = cupy.asarray(block)  # __cuda_array_interface__
        assert a.dtype == cupy.uint8 and a.shape == (n,) and a.data.ptr == block.ptr
        a[:] = (cupy.arange(n, dtype=cupy.uint32) % 251).astype(cupy.uint8)
        cupy.cuda.get_current_stream().synchronize()

        t = torch.from_dlpack(block)  # __dlpack_device__ then __dlpack__(stream=...)
        assert t.dtype == torch.uint8 and t.shape == (n,) and t.data_ptr() == block.ptr
        expected = (torch.arange(n, dtype=torch.int64, device="cuda") % 251).to(torch.uint8)
        assert torch.equal(t, expected)

        t.add_(1)  # torch writes, CuPy reads
        torch.cuda.current_stream().synchronize()
        b = cupy.asarray(block)
        assert bytes(cupy.asnumpy(b)) == bytes(t.cpu().numpy())
        assert int(b[0]) == 1 and int(b[250]) == 251 % 256

        # the views keep the block alive; it is freed after the last one goes
        gone = weakref.ref(block)
        del a, b, block
        gc.collect()
        assert gone() is not None and rt.stats().live_blocks == 1
        del t
        gc.collect()
        assert gone() is None and rt.stats().live_blocks == 0
        stream.synchronize()


def test_torch_stream_waits_for_block_stream(cuda_runtime):
    rt, cupy, torch = cuda_runtime
    n = 1 << 22
    with rt.acquire_stream() as stream:
        block = rt.allocate(n, stream)
        # CuPy writes on the block's own stream, torch reads on a side stream
        block.prepare(stream, "write")
        with cupy.cuda.ExternalStream(stream.native):
            cupy.asarray(block).fill(7)
        block.finish(stream, "write")  # the write recorded on the block's stream
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            t = torch.from_dlpack(block)  # side waits for the block's stream
            total = int(t.to(torch.int64).sum())
        assert total == 7 * n
        del t
        block.free()
        stream.synchronize()
