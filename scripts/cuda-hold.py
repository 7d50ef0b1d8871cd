#!/usr/bin/env python3
"""Owns the CUDA process of scripts/gpu-smoke.sh: it holds 1 GiB on CUDA device 0, writes its own
pid to $SMOKE_CUDA_PID_FILE (a temporary file, then a rename) and sleeps until it is killed.

It holds the memory through the CUDA driver API (libcuda.so.1, which every NVIDIA driver installs)
called with ctypes, so a GPU machine needs nothing beyond python3; only when that fails (no driver
library, or an allocation that fails) through torch. The driver comes first because it needs no
import: a torch that takes minutes to import (a large environment on a cold or network filesystem)
must not use up the time the driver way needs. --ways picks the ways and their order, so that
gpu-smoke.sh can give each its own time limit.
It sets CUDA_DEVICE_ORDER=PCI_BUS_ID and, before CUDA starts, points CUDA_VISIBLE_DEVICES at what
nvidia-smi calls GPU 0: nothing (the variable is dropped, so CUDA's device 0 is GPU 0), or, when
`nvidia-smi -L` lists MIG devices under GPU 0, the first of them by its MIG UUID (with MIG enabled
CUDA sees MIG devices only, and which one is device 0 is not otherwise defined).

  cuda-hold.py [--ways driver,torch] --check   prints how it would hold the memory, or exits 1
                                               saying why it cannot
  cuda-hold.py [--ways driver,torch]           holds the memory, or exits 1 saying why each way
                                               failed

SMOKE_CUDA_DRIVER_LIB names another driver library (tests load a stand-in with it); NVIDIA_SMI the
nvidia-smi asked for MIG devices (default: nvidia-smi on PATH).
"""
import ctypes
import os
import re
import subprocess
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


WAYS = {"driver": through_driver, "torch": through_torch}
USAGE = "usage: cuda-hold.py [--ways driver,torch] [--check]"


def gpu0_mig_device(nvidia_smi):
    """The UUID of the first MIG device `nvidia-smi -L` lists under GPU 0, or None (no MIG device,
    or nvidia-smi cannot say: CUDA then numbers whole GPUs, as without MIG). The listing looks like
      GPU 0: NVIDIA H200 (UUID: GPU-...)
        MIG 1c.3g.71gb  Device  0: (UUID: MIG-...)
    (older drivers print MIG UUIDs as MIG-GPU-<uuid>/<gi>/<ci>, which CUDA takes as well)."""
    try:
        listing = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    in_gpu0 = False
    for line in listing.splitlines():
        if line.startswith("GPU "):
            in_gpu0 = line.startswith("GPU 0:")
            continue
        found = re.search(r"\(UUID: (MIG-[^)\s]+)\)", line)
        if in_gpu0 and found:
            return found.group(1)
    return None


def parse_args(args):
    """(check, ways) from the arguments; None when they are not understood."""
    check = False
    ways = ["driver", "torch"]
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--check":
            check = True
        elif arg == "--ways" and rest:
            ways = rest.pop(0).split(",")
            if not ways or any(way not in WAYS for way in ways):
                return None
        else:
            return None
    return check, ways


def main(args):
    parsed = parse_args(args)
    if parsed is None:
        print(f"cuda-hold: unknown arguments {' '.join(args)}; {USAGE}", file=sys.stderr)
        return 2
    check, ways = parsed
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    mig = gpu0_mig_device(os.environ.get("NVIDIA_SMI") or "nvidia-smi")
    if mig is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = mig
    on = "" if mig is None else f" on GPU 0's MIG device {mig}"
    reasons = []
    for way in ways:
        try:
            what, hold = WAYS[way]()
        except Unavailable as err:
            reasons.append(str(err))
            continue
        if check:
            print(what + on)
            return 0
        try:
            held = hold()
        except Unavailable as err:
            reasons.append(f"{what} could not hold it: {err}")
            continue
        hold_until_killed(what + on, held)
    where = "" if mig is None else f" (CUDA_VISIBLE_DEVICES={mig}, GPU 0's first MIG device)"
    print(f"cuda-hold: cannot hold memory on GPU 0: {'; '.join(reasons)}{where}", file=sys.stderr)
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
