import ctypes
import glob
import os

_here = os.path.dirname(__file__)
_found = sorted(glob.glob(os.path.join(_here, "libctops_native*.so")))
if not _found:
    raise ImportError(f"ctops: no native library in {_here}")
lib = ctypes.CDLL(_found[0])
lib.cfloat_saxpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float,
                             ctypes.c_int64]
lib.cfloat_clamp_.argtypes = [ctypes.c_void_p, ctypes.c_float, ctypes.c_float, ctypes.c_int64]
