#!/usr/bin/env python3
"""Owns the CUDA process of scripts/gpu-smoke.sh: it holds 1 GiB on CUDA device 0, writes its own
pid to $SMOKE_CUDA_PID_FILE (a temporary file, then a rename) and sleeps until it is killed.

It holds the memory through torch when torch sees a CUDA device, and otherwise (no torch, a broken
one, or one whose allocation fails) through the CUDA driver API (libcuda.so.1, which every NVIDIA
driver installs) called with ctypes, so a GPU machine without torch needs nothing beyond python3.
It sets CUDA_DEVICE_ORDER=PCI_BUS_ID and drops CUDA_VISIBLE_DEVICES before CUDA starts, so that
CUDA's device 0 is nvidia-smi's GPU 0.

  cuda-hold.py --check   prints how it would hold the memory, or exits 1 saying why it cannot
  cuda-hold.py           holds the memory, or exits 1 saying why each way failed

SMOKE_CUDA_DRIVER_LIB names another driver library (tests load a stand-in with it).
"""
import ctypes
import os
import sys
import time

GIB = 1024**3


class Unavailable(Exception):
    """This way of holding GPU memory does not work here; the message says why."""


def through_torch():
    try:
        import torch
    except ModuleNotFoundError as err:
        if err.name != "torch":
            raise Unavailable(f"torch cannot be imported ({type(err).__name__}: {err})") from None
        raise Unavailable("torch is not installed") from None
    except Exception as err:  # a torch that cannot load its own libraries, say
        raise Unavailable(f"torch cannot be imported ({type(err).__name__}: {err})") from None
    try:
        available = torch.cuda.is_available()
    except Exception as err:
        raise Unavailable(f"torch {torch.__version__} cannot ask CUDA ({type(err).__name__}: {err})") from None
    if not available:
        raise Unavailable(f"torch {torch.__version__} sees no CUDA device (a CPU-only build, or no driver access)")

    def hold():
        try:
            tensor = torch.empty(GIB, dtype=torch.uint8, device="cuda:0")
            tensor.fill_(1)
            torch.cuda.synchronize()
        except Exception as err:
            raise Unavailable(f"{type(err).__name__}: {err}") from None
        return tensor

    return f"torch {torch.__version__}", hold


def through_driver():
    library = os.environ.get("SMOKE_CUDA_DRIVER_LIB", "libcuda.so.1")
    try:
        cuda = ctypes.CDLL(library)
    except OSError as err:
        raise Unavailable(f"the CUDA driver library cannot be loaded ({err})") from None

    def call(name, *args):
        status = getattr(cuda, name)(*args)
        if status != 0:
            text = ctypes.c_char_p()
            cuda.cuGetErrorName(status, ctypes.byref(text))
            raise Unavailable(f"{name} failed: {(text.value or b'unknown error').decode()} ({status})")

    call("cuInit", 0)
    count = ctypes.c_int()
    call("cuDeviceGetCount", ctypes.byref(count))
    if count.value < 1:
        raise Unavailable("the CUDA driver sees no device")
    version = ctypes.c_int()
    call("cuDriverGetVersion", ctypes.byref(version))

    def hold():
        device = ctypes.c_int()
        call("cuDeviceGet", ctypes.byref(device), 0)
        context = ctypes.c_void_p()
        call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        call("cuCtxSetCurrent", context)
        pointer = ctypes.c_uint64()
        call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(GIB))
        call("cuMemsetD8_v2", pointer, ctypes.c_ubyte(1), ctypes.c_size_t(GIB))
        call("cuCtxSynchronize")
        return pointer

    major, minor = divmod(version.value, 1000)
    return f"the CUDA driver API ({library}, CUDA {major}.{minor // 10})", hold


def main(args):
    if args not in ([], ["--check"]):
        print(f"cuda-hold: unknown arguments {' '.join(args)}; usage: cuda-hold.py [--check]", file=sys.stderr)
        return 2
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    reasons = []
    for way in (through_torch, through_driver):
        try:
            what, hold = way()
        except Unavailable as err:
            reasons.append(str(err))
            continue
        if args == ["--check"]:
            print(what)
            return 0
        try:
            held = hold()
        except Unavailable as err:
            reasons.append(f"{what} could not hold it: {err}")
            continue
        hold_until_killed(what, held)
    print(f"cuda-hold: cannot hold memory on GPU 0: {'; '.join(reasons)}", file=sys.stderr)
    return 1


def hold_until_killed(what, held):
    """Writes this process's pid where gpu-smoke.sh waits for it, then sleeps until it is killed.

    `held` (the tensor or device pointer) stays referenced by this frame, so the memory stays
    allocated for as long as the process lives.
    """
    path = os.environ["SMOKE_CUDA_PID_FILE"]
    with open(path + ".tmp", "w") as pid_file:
        pid_file.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    print(f"cuda-hold: pid {os.getpid()} holds 1 GiB on GPU 0 through {what}", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
