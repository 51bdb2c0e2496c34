"""Sandbox sizes as settings write them: Kubernetes quantity syntax ("4Gi", "500M", "1.5Gi", "500m"
CPUs), the one parser both backends use, and the rule a local sandbox's sizes must keep.

The settings FROGFIX_SANDBOX_MEMORY, _WORKSPACE_SIZE, _TMP_SIZE and _CPU are written this way
whichever backend reads them, so the local sandbox and the pod manifests agree on what "4Gi" means.
Stdlib only: `app/settings.py` imports this module (and nothing else of sandbox/) to refuse a bad
size when settings load.
"""

from __future__ import annotations

import re

BYTE_UNITS = {
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5,
    "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5,
}  # fmt: skip
# A sandbox's memory total (processes and, locally, its tmpfs files) unless FROGFIX_SANDBOX_MEMORY says otherwise.
DEFAULT_MEMORY_BYTES = 4 * 1024**3
SHM_SIZE_BYTES = 64 * 1024**2  # the local sandbox's /dev/shm tmpfs
# What the local sandbox's memory must keep for its processes once its tmpfs are full, so that a
# full workspace ends in ENOSPC for the writer, not in an OOM kill of the runner.
PROCESS_FLOOR_BYTES = 512 * 1024**2
_BYTES = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?\s*")
_CPUS = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(m)?\s*")


def parse_quantity(quantity: str | int) -> int:
    """A byte quantity ("4Gi", "500M", "1.5Gi", "1048576") in bytes; ValueError names the bad text."""
    match = _BYTES.fullmatch(str(quantity))
    if not match:
        raise ValueError(f"not a byte quantity: {quantity!r} (write it like 4Gi, 512Mi or 1048576)")
    return int(float(match.group(1)) * BYTE_UNITS.get(match.group(2) or "", 1))


def format_quantity(size: int) -> str:
    """The shortest exact binary form of a byte count ("4Gi"), else the plain number."""
    for unit in ("Gi", "Mi", "Ki"):
        if size % BYTE_UNITS[unit] == 0:
            return f"{size // BYTE_UNITS[unit]}{unit}"
    return str(size)


def parse_cpus(quantity: str | float) -> float:
    """A CPU quantity ("2", "1.5", "500m") in CPUs; ValueError names the bad text."""
    match = _CPUS.fullmatch(str(quantity))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"not a CPU quantity: {quantity!r} (write it like 2, 1.5 or 500m)")
    value = float(match.group(1))
    return value / 1000 if match.group(2) else value


def format_cpus(cpus: float) -> str:
    """A CPU count as a quantity `parse_cpus` reads back ("2", "1500m"), in whole millicpus."""
    millis = max(1, round(cpus * 1000))
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def check_local_memory(
    memory_bytes: int,
    workspace_bytes: int,
    tmp_bytes: int,
    names: tuple[str, str, str] = ("memory", "workspace", "tmp"),
) -> None:
    """The local sandbox's memory is one total for its processes and its in-RAM files (workspace,
    /tmp, /dev/shm are tmpfs, charged to its memory cgroup); ValueError, naming `names` (memory,
    workspace, tmp), unless the files fit with PROCESS_FLOOR_BYTES left for processes."""
    needed = workspace_bytes + tmp_bytes + SHM_SIZE_BYTES + PROCESS_FLOOR_BYTES
    if needed > memory_bytes:
        memory, workspace, tmp = names
        raise ValueError(
            f"{workspace} {format_quantity(workspace_bytes)} + {tmp} {format_quantity(tmp_bytes)} + "
            f"{format_quantity(SHM_SIZE_BYTES)} /dev/shm + {format_quantity(PROCESS_FLOOR_BYTES)} for processes "
            f"= {format_quantity(needed)} exceed {memory} {format_quantity(memory_bytes)}: a local sandbox's "
            "memory is the one total of its processes and its in-RAM workspace and /tmp; lower the sizes or "
            "raise the memory"
        )
