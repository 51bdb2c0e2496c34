"""Kubernetes quantity syntax ("4Gi", "500M", "1.5Gi", "500m" CPUs): the one parser both backends use.

The settings FROGFIX_SANDBOX_WORKSPACE_SIZE, _TMP_SIZE and _CPU are written this way whichever
backend reads them, so the local sandbox and the pod manifests agree on what "4Gi" means.
"""

from __future__ import annotations

import re

BYTE_UNITS = {
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5,
    "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5,
}  # fmt: skip
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
