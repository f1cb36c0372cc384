"""MoE token dispatch over the intra-node path, in miniature.

The intra-node all-to-all is native code that waits for the peer GPUs' barrier; here it is
libc's `usleep` standing in for that wait, called through ctypes.
"""

from __future__ import annotations

import ctypes

# The intra-node path's native library (libc stands in for the communication library).
_intranode = ctypes.PyDLL("libc.so.6")
_intranode.usleep.argtypes = [ctypes.c_uint]


def intranode_dispatch(wait_us: int) -> None:
    """Send this step's tokens to their experts on the other GPUs of the node and wait for them."""
    _intranode.usleep(wait_us)
