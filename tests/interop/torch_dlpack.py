"""Tensors between ccgraph and PyTorch through DLPack, both ways, host and (with a GPU) device.

    python3 tests/interop/torch_dlpack.py <path to libccgraph_dlpack_capi.so>

Exits 77 (CTest's skip) where PyTorch is not installed. ccgraph's side is tests/interop/
dlpack_capi.cpp, loaded with ctypes; capsules follow DLPack's protocol: a consumer renames the
capsule "used_dltensor" once it owns the tensor."""
import ctypes
import math
import sys

try:
    import torch
    import torch.utils.dlpack
except ImportError:
    print("torch_dlpack: PyTorch is not installed: skipped")
    sys.exit(77)

lib = ctypes.CDLL(sys.argv[1])
lib.capi_arange.restype = ctypes.c_void_p
lib.capi_arange.argtypes = [ctypes.c_int64, ctypes.c_int]
lib.capi_last_sum.restype = ctypes.c_double
for f in (lib.capi_sum, lib.capi_count_true):
    f.restype = ctypes.c_double
    f.argtypes = [ctypes.c_void_p]

api = ctypes.pythonapi
api.PyCapsule_New.restype = ctypes.py_object
api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
api.PyCapsule_GetPointer.restype = ctypes.c_void_p
api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
api.PyCapsule_SetName.restype = ctypes.c_int
api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]


def to_ccgraph(fn, t):
    """Hands torch tensor t to ccgraph's fn; the capsule is marked used only when ccgraph took it."""
    cap = torch.utils.dlpack.to_dlpack(t)
    result = fn(api.PyCapsule_GetPointer(cap, b"dltensor"))
    if not math.isnan(result):
        api.PyCapsule_SetName(cap, b"used_dltensor")
    return result


def check(dev):
    where = "cpu" if dev < 0 else f"cuda:{dev}"
    # ccgraph -> torch: one memory, seen from both sides.
    t = torch.utils.dlpack.from_dlpack(api.PyCapsule_New(lib.capi_arange(6, dev), b"dltensor", None))
    assert str(t.device) == where, (t.device, where)
    assert t.dtype == torch.float32
    assert t.tolist() == [0, 1, 2, 3, 4, 5], t.tolist()
    t.add_(1)
    if dev >= 0:
        torch.cuda.synchronize()
    assert lib.capi_last_sum() == 21, lib.capi_last_sum()  # ccgraph reads torch's write
    del t
    # torch -> ccgraph: a strided view, an offset view, bool, and a dtype ccgraph refuses.
    x = torch.arange(10, dtype=torch.float32, device=where)
    assert to_ccgraph(lib.capi_sum, x[::2]) == 20
    assert to_ccgraph(lib.capi_sum, x[3:6]) == 12
    assert to_ccgraph(lib.capi_sum, x.reshape(2, 5).t()) == 45
    b = torch.tensor([True, False, True, True], device=where)
    assert to_ccgraph(lib.capi_count_true, b) == 3
    assert math.isnan(to_ccgraph(lib.capi_sum, torch.arange(3, device=where)))  # int64: refused
    print(f"torch_dlpack: {where}: ccgraph <-> torch OK")


check(-1)
if torch.cuda.is_available():
    check(0)
print("torch_dlpack: OK")
