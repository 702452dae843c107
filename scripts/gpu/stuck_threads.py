"""Watch the processes whose command line contains a pattern and, for each thread that spins at full CPU
for several seconds (a driver call waiting on the GPU, or a thread holding a lock others wait for),
print where it runs: ptrace stops it briefly, reads its instruction pointer and scans its stack for
return addresses into executable mappings, then lets it go. Addresses are printed as (file, offset) and,
where the file exports a symbol before them, that symbol; symbolize cudacore's own library locally from
the same wheel. Also samples every thread of such a process that sleeps in a futex, for the lock side.

    python scripts/gpu/stuck_threads.py PATTERN SECONDS   # Linux, as root or with ptrace rights
"""

import ctypes
import ctypes.util
import os
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_GETREGS, PTRACE_DETACH = 0x4206, 0x4207, 12, 17
WALL = 0x40000000
HZ = os.sysconf("SC_CLK_TCK")


REGS = ["r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx", "rsi", "rdi",
        "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs"]  # fmt: skip


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in REGS]


class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
loaded: dict[str, int] = {}


def symbol(path: str, off: int) -> str:
    """The exported symbol at or before file offset off of the shared object path, if it can be loaded."""
    if path not in loaded:
        loaded[path] = 0
        if ".so" in path:
            try:
                ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
                for line in read("/proc/self/maps").splitlines():
                    parts = line.split()
                    if len(parts) >= 6 and parts[5] == path and int(parts[2], 16) == 0:
                        loaded[path] = int(parts[0].split("-")[0], 16)
                        break
            except OSError:
                pass
    base = loaded[path]
    if not base:
        return ""
    info = DlInfo()
    if libc.dladdr(ctypes.c_void_p(base + off), ctypes.byref(info)) and info.sname:
        return f"{info.sname.decode()}+0x{base + off - info.saddr:x}"
    return ""


def maps(pid: int) -> list[tuple[int, int, int, str]]:
    out = []
    for line in read(f"/proc/{pid}/maps").splitlines():
        parts = line.split()
        if len(parts) >= 6 and "x" in parts[1]:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, int(parts[2], 16), parts[5]))
    return out


def where(addr: int, regions: list[tuple[int, int, int, str]]) -> str | None:
    for lo, hi, off, path in regions:
        if lo <= addr < hi:
            o = addr - lo + off
            s = symbol(path, o)
            return f"{os.path.basename(path)}+0x{o:x}" + (f" ({s})" if s else "")
    return None


def sample(pid: int, tid: int) -> str:
    if libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
        return f"    (ptrace failed: errno {ctypes.get_errno()})"
    try:
        libc.ptrace(PTRACE_INTERRUPT, tid, None, None)
        os.waitpid(tid, WALL)
        r = Regs()
        libc.ptrace(PTRACE_GETREGS, tid, None, ctypes.byref(r))
        regions = maps(pid)
        lines = [f"    rip {where(r.rip, regions)}"]
        data = b""
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
            at = r.rsp
            while len(data) < 1 << 16:  # page by page, up to the end of the stack's mapping
                try:
                    f.seek(at)
                    chunk = f.read(4096 - at % 4096)
                except OSError:
                    break
                if not chunk:
                    break
                data += chunk
                at += len(chunk)
        seen = 0
        for i in range(0, len(data) - 7, 8):
            w = where(int.from_bytes(data[i : i + 8], "little"), regions)
            if w is not None:
                lines.append(f"    sp+0x{i:x}: {w}")
                seen += 1
                if seen >= 40:
                    break
        return "\n".join(lines)
    finally:
        libc.ptrace(PTRACE_DETACH, tid, None, None)


def threads(pid: int) -> dict[int, tuple[str, int, str]]:
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = read(f"/proc/{pid}/task/{t}/stat")
            wchan = read(f"/proc/{pid}/task/{t}/wchan")
        except OSError:
            continue
        f = stat[stat.rindex(")") + 2 :].split()
        out[int(t)] = (f[0], int(f[11]) + int(f[12]), wchan)
    return out


def main() -> None:
    pattern, seconds = sys.argv[1], float(sys.argv[2])
    busy_for: dict[tuple[int, int], int] = {}
    done: set[int] = set()
    prev: dict[tuple[int, int], int] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1)
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) == os.getpid() or int(p) in done:
                continue
            pid = int(p)
            try:
                if pattern not in read(f"/proc/{pid}/cmdline").replace("\0", " "):
                    continue
                ts = threads(pid)
            except OSError:
                continue
            for tid, (_state, ticks, _) in ts.items():
                k = (pid, tid)
                used = ticks - prev.get(k, ticks)
                prev[k] = ticks
                busy_for[k] = busy_for.get(k, 0) + 1 if used >= 0.9 * HZ else 0
            stuck = [tid for tid in ts if busy_for.get((pid, tid), 0) >= 5]
            if not stuck:
                continue
            done.add(pid)
            print(f"== process {pid}: threads spinning for 5 s: {stuck}", flush=True)
            for tid, (state, _, wchan) in sorted(ts.items()):
                if tid in stuck or (tid == pid) or "futex" in wchan:
                    print(f"  thread {tid} state {state} wchan {wchan}", flush=True)
                    for _ in range(2 if tid in stuck else 1):
                        print(sample(pid, tid), flush=True)


if __name__ == "__main__":
    main()
