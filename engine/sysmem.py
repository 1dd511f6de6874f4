"""How much memory this process may still use: the smaller of the machine's available memory
and what its cgroup (v2 memory.max or v1 memory.limit_in_bytes) still allows."""
from __future__ import annotations

from pathlib import Path

import psutil


def _cgroup_room(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> int | None:
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":  # v2 unified hierarchy
            limit_file, usage_file = root / rel / "memory.max", root / rel / "memory.current"
        elif "memory" in controllers.split(","):
            base = root / "memory" / rel
            limit_file, usage_file = base / "memory.limit_in_bytes", base / "memory.usage_in_bytes"
        else:
            continue
        try:
            limit = limit_file.read_text().strip()
            usage = int(usage_file.read_text().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or int(limit) >= 1 << 60:
            continue
        return max(0, int(limit) - usage)
    return None


def available_memory() -> int:
    host = psutil.virtual_memory().available
    room = _cgroup_room()
    return host if room is None else min(host, room)
