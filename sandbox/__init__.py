"""Isolated workspaces for FrogFix jobs: the Sandbox protocol and its backends.

Import the protocol and data types from here (or `sandbox.base`); start one with `open_sandbox`.
This package imports nothing else of FrogFix.
"""

from sandbox.base import (
    CommandResult,
    PatchTooLarge,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxSpec,
    SandboxUnavailable,
)
from sandbox.factory import open_sandbox

__all__ = [
    "CommandResult",
    "PatchTooLarge",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxSpec",
    "SandboxUnavailable",
    "open_sandbox",
]
