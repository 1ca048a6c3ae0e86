"""Device isolation of a run's GPUs (design note 036): a job may open only its own GPUs'
``/dev/nvidiaN`` (and ``nvidiactl``, ``nvidia-modeset``, ``nvidia-uvm``, ``nvidia-caps``).

* cgroup v1 (a hybrid host's ``devices`` hierarchy): ``deny_gpus`` writes every other GPU
  minor to the run's ``devices.deny``.
* cgroup v2: an eBPF ``BPF_PROG_TYPE_CGROUP_DEVICE`` program attached to the run's cgroup
  (what systemd's ``DeviceAllow=`` and runc load), assembled here - eleven instructions
  plus one per GPU - and loaded with the ``bpf(2)`` system call through ctypes
  (``attach_gpu_filter``). It allows every device but the NVIDIA GPU minors 0..253 not
  given to the run; attached with ``BPF_F_ALLOW_MULTI``, so a parent's programs (systemd's)
  still apply. The program lives while the cgroup does.

The NVIDIA character major is read from ``/proc/devices`` (``nvidia-frontend`` or
``nvidia``), 195 (the driver's fixed one) when neither is listed. Linux only; stdlib only.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from pathlib import Path

#: the NVIDIA character device major when ``/proc/devices`` does not name it (``/dev/nvidiaN``)
NVIDIA_MAJOR = 195
#: GPU minors are 0..253; 254 is ``/dev/nvidia-modeset``, 255 ``/dev/nvidiactl`` (every job needs them)
NVIDIA_GPU_MINORS = range(0, 254)
FIRST_SHARED_MINOR = 254

#: bpf(2): its number per machine (x86_64, aarch64), commands, program and attach types
SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_PROG_LOAD, BPF_PROG_ATTACH = 5, 8
BPF_PROG_TYPE_CGROUP_DEVICE, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI = 15, 6, 2
#: ``struct bpf_cgroup_dev_ctx``: ``access_type`` (type in the low 16 bits), ``major``, ``minor``
BPF_DEVCG_DEV_CHAR = 2
#: the size of ``union bpf_attr`` passed (the kernel takes a larger one if its tail is zero)
ATTR_SIZE = 128

# eBPF opcodes used (linux/bpf_common.h, linux/bpf.h)
_LDX_MEM_W = 0x61   # dst = *(u32 *)(src + off)
_ALU_AND_K = 0x54   # dst &= imm (32 bits)
_JNE_K, _JEQ_K, _JGE_K = 0x55, 0x15, 0x35
_MOV64_K = 0xB7     # dst = imm
_EXIT = 0x95


def nvidia_major(proc_devices: str = "/proc/devices") -> int:
    """The character major of ``/dev/nvidiaN`` (``nvidia-frontend`` or ``nvidia`` in
    ``/proc/devices``' character devices; ``NVIDIA_MAJOR`` when neither is listed)."""
    try:
        with open(proc_devices) as f:
            text = f.read().split("Block devices:")[0]
    except OSError:
        return NVIDIA_MAJOR
    for line in text.splitlines():
        num, _, name = line.strip().partition(" ")
        if name in ("nvidia-frontend", "nvidia") and num.isdigit():
            return int(num)
    return NVIDIA_MAJOR


def deny_gpus(devices_cg: Path, allowed: frozenset[int], major: int | None = None) -> None:
    """In the cgroup v1 devices cgroup ``devices_cg``, deny every NVIDIA GPU minor
    (``c MAJOR:M rwm``, M in 0..253) that is not in ``allowed``. A v1 devices list that
    allows everything (a new cgroup's) keeps *exceptions*: ``deny c 195:* rwm`` then
    ``allow c 195:0 rwm`` would leave 195:0 denied (an allow only removes an exception
    that matches exactly), so each other minor is denied (note 036).

    Raises:
        OSError: ``devices.deny`` cannot be written.
    """
    major = nvidia_major() if major is None else major
    fd = os.open(devices_cg / "devices.deny", os.O_WRONLY)
    try:
        for minor in NVIDIA_GPU_MINORS:
            if minor not in allowed:
                os.write(fd, f"c {major}:{minor} rwm".encode())  # one rule a write
    finally:
        os.close(fd)


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def gpu_filter(allowed: frozenset[int], major: int) -> bytes:
    """The device program: allow (return 1) anything but a character device of ``major``
    whose minor is below 254 and not in ``allowed``; deny (0) those."""
    head = [_insn(_LDX_MEM_W, 2, 1, 0), _insn(_ALU_AND_K, 2, imm=0xFFFF),  # r2 = the device type
            _insn(_LDX_MEM_W, 3, 1, 4), _insn(_LDX_MEM_W, 4, 1, 8)]       # r3 = major, r4 = minor
    tests = [(_JNE_K, 2, BPF_DEVCG_DEV_CHAR), (_JNE_K, 3, major)]
    tests += [(_JEQ_K, 4, m) for m in sorted(allowed) if m in NVIDIA_GPU_MINORS]
    tests.append((_JGE_K, 4, FIRST_SHARED_MINOR))
    # each test jumps past the rest and the two "deny" instructions to "allow"
    body = [_insn(op, reg, off=len(tests) - i - 1 + 2, imm=imm) for i, (op, reg, imm) in enumerate(tests)]
    tail = [_insn(_MOV64_K, 0, imm=0), _insn(_EXIT), _insn(_MOV64_K, 0, imm=1), _insn(_EXIT)]
    return b"".join(head + body + tail)


def _bpf(cmd: int, attr: bytes) -> int:
    """``bpf(cmd, attr, ATTR_SIZE)``.

    Raises:
        OSError: the call failed (its errno), or this machine's bpf(2) number is unknown.
    """
    number = SYS_BPF.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"bpf(2) on {platform.machine()}: not known here")
    buf = ctypes.create_string_buffer(attr.ljust(ATTR_SIZE, b"\0"), ATTR_SIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(number), ctypes.c_long(cmd), buf, ctypes.c_long(ATTR_SIZE))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"bpf({'BPF_PROG_LOAD' if cmd == BPF_PROG_LOAD else 'BPF_PROG_ATTACH'}): {os.strerror(e)}")
    return int(r)


def load_gpu_filter(allowed: frozenset[int], major: int | None = None) -> int:
    """Load the device program (``gpu_filter``); its file descriptor.

    Raises:
        OSError: the kernel refused it (no ``CONFIG_CGROUP_BPF``, not privileged, seccomp).
    """
    code = gpu_filter(allowed, nvidia_major() if major is None else major)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    attr = struct.pack("<IIQQIIQII16s", BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8, ctypes.addressof(insns),
                       ctypes.addressof(license_), 0, 0, 0, 0, 0, b"gs_gpu_devices")
    return _bpf(BPF_PROG_LOAD, attr)


def attach_gpu_filter(cgroup: Path, allowed: frozenset[int], major: int | None = None) -> None:
    """Attach a device program allowing only ``allowed`` GPU minors to the cgroup v2
    directory ``cgroup`` (``BPF_F_ALLOW_MULTI``; the program is dropped with the cgroup).

    Raises:
        OSError: it cannot be loaded or attached.
    """
    prog = load_gpu_filter(allowed, major)
    try:
        cg = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
        try:
            _bpf(BPF_PROG_ATTACH, struct.pack("<IIII", cg, prog, BPF_CGROUP_DEVICE, BPF_F_ALLOW_MULTI))
        finally:
            os.close(cg)
    finally:
        os.close(prog)


def bpf_devices_refusal() -> str | None:
    """Why an eBPF device program cannot be loaded here (``None``: it can): loads one
    and closes it."""
    try:
        os.close(load_gpu_filter(frozenset()))
    except OSError as exc:
        return exc.strerror or str(exc)
    return None
