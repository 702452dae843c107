"""What the real driver does to a capture when peer access is enabled meanwhile: whether cuCtxEnablePeerAccess
and cuMemPoolSetAccess are "potentially unsafe" calls (refused with 900, the capture invalidated) or leave
the capture going, by capture mode and by the thread that makes the call.

cudacore's Device.enable_peer_access makes both calls without a capture check, while the allocators of
cudacore.interop (process.Device.LibraryAllocates) make them only where no capture runs, taking them for
unsafe calls; the simulator (pkg/cudasim, CtxEnablePeerAccess and MemPoolSetAccess) lets them through in
every mode. This says which of the three matches the driver.

Needs two GPUs that can access each other. Each case runs in a fresh interpreter (peer access, once
enabled, stays for the context's life) and prints the call's result, the capture's status just after it
(cuStreamGetCaptureInfo) and what cuStreamEndCapture answers. Run on the GPU machine:
python3 scripts/gpu/peer_access_capture_probe.py
"""

from __future__ import annotations

import textwrap

from _probe import DRIVER_PRELUDE, run_case

# s (from the prelude) is a non-blocking stream of device 0; ctx1 is device 1's primary context and pool1
# its default pool. The capture begins on the main thread; the call runs there or on a second thread.
SETUP = DRIVER_PRELUDE + textwrap.dedent("""
    import threading
    dev1 = ok(cu.cuDeviceGet(1)); ctx1 = ok(cu.cuDevicePrimaryCtxRetain(dev1))
    assert ok(cu.cuDeviceCanAccessPeer(dev, dev1)) == 1, "devices 0 and 1 cannot access each other"
    pool1 = ok(cu.cuDeviceGetDefaultMemPool(dev1))
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = 0
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    MODE = {"global": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
            "thread_local": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            "relaxed": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED}
    CALLS = {
        "cuCtxEnablePeerAccess": lambda: cu.cuCtxEnablePeerAccess(ctx1, 0),
        "cuMemPoolSetAccess": lambda: cu.cuMemPoolSetAccess(pool1, [desc], 1),
        "cuDeviceCanAccessPeer (control)": lambda: cu.cuDeviceCanAccessPeer(dev, dev1),
    }
    def case(mode, where, what):
        ok(cu.cuStreamBeginCapture(s, MODE[mode]))
        out = []
        def call():
            ok(cu.cuCtxSetCurrent(ctx))
            r = CALLS[what]()
            out.append((r[0] if isinstance(r, tuple) else r).name.replace("CUDA_ERROR_", "").replace("CUDA_", ""))
        if where == "this thread":
            call()
        else:
            t = threading.Thread(target=call); t.start(); t.join()
        st = cu.cuStreamGetCaptureInfo(s)[1].name.replace("CU_STREAM_CAPTURE_STATUS_", "")
        end = cu.cuStreamEndCapture(s)
        print(f"call {out[0]}; capture then {st}; end {end[0].name.replace('CUDA_ERROR_', '').replace('CUDA_', '')}")
""")

for what in ("cuCtxEnablePeerAccess", "cuMemPoolSetAccess", "cuDeviceCanAccessPeer (control)"):
    for mode in ("global", "thread_local", "relaxed"):
        for where in ("this thread", "other thread"):
            rc, out = run_case(SETUP + f"\ncase({mode!r}, {where!r}, {what!r})\n")
            print(f"{what:32s} {mode:13s} {where:13s} exit {rc:3d}  {out[:120]}")
