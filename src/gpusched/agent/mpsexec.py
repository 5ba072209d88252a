"""``python -m gpusched.agent.mpsexec SHM_DIR COMMAND...``: run COMMAND (the MPS control daemon) in a mount
namespace of its own where ``SHM_DIR`` is bound over ``/dev/shm``, so that the daemon and the share containers
(which get ``SHM_DIR`` mounted at their ``/dev/shm``) exchange shared memory there and nowhere else.

A fresh process does it (one thread, before exec), not the agent: ``unshare(CLONE_NEWNS)`` would move the
whole agent. Needs CAP_SYS_ADMIN; without it, exits 2 with one line saying so.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

CLONE_NEWNS = 0x00020000
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18


def _fail(msg: str) -> None:
    sys.stderr.write(f"gpusched.agent.mpsexec: {msg}\n")
    raise SystemExit(2)


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        _fail("usage: python -m gpusched.agent.mpsexec SHM_DIR COMMAND [ARGS...]")
    shm, cmd = argv[0], argv[1:]
    if not os.path.isdir(shm):
        _fail(f"{shm} is not a directory")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    if libc.unshare(CLONE_NEWNS) != 0:
        _fail(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())} (needs CAP_SYS_ADMIN)")
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        _fail(f"making / private: {os.strerror(ctypes.get_errno())}")
    os.makedirs("/dev/shm", exist_ok=True)
    if libc.mount(shm.encode(), b"/dev/shm", None, MS_BIND, None) != 0:
        _fail(f"binding {shm} over /dev/shm: {os.strerror(ctypes.get_errno())}")
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        _fail(f"{cmd[0]}: {e}")


if __name__ == "__main__":
    main(sys.argv[1:])
