"""Faults of the local endpoint's server, made for real: the ``tritonserver`` process killed."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any


def server_pid(server: Any) -> int:
    """The ``tritonserver`` process of ``server`` (a :class:`TritonServer`): the process itself,
    or, in its network namespace, the forwarder's child of that name, in the same process group."""
    group = server.process.pid
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if name == "tritonserver" and int(fields[2]) == group:  # fields: state, ppid, pgrp, ...
            return int(entry.name)
    raise LookupError(f"no tritonserver process in process group {group}")


def kill_tritonserver(server: Any) -> int:
    """SIGKILL the server's ``tritonserver`` process (not the forwarder): returns its pid."""
    pid = server_pid(server)
    os.kill(pid, signal.SIGKILL)
    return pid
