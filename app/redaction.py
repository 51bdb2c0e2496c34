"""Secrets out of everything FrogFix writes: the logs, the forge's text, trajectories and job records.

The one place a secret becomes `[REDACTED]`: `SecretRedactor` (the configured secret values,
longest first, so a secret that contains another is replaced whole) for text, as a structlog
processor for log events, and `redact_value` for JSON-like values (keys included). Standard
library only: the forge clients, the logs and the agent loop's trajectory writer all import it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import Any

REDACTED = "[REDACTED]"


def longest_first(secrets: Iterable[str]) -> list[str]:
    """The non-empty secrets, each once, longest first."""
    return sorted({s for s in secrets if s}, key=len, reverse=True)


class SecretRedactor:
    """Replaces every configured secret value; a plain callable's `redact`, and a structlog processor."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = longest_first(secrets)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def __call__(self, _logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if not self.secrets:
            return event_dict
        return {k: redact_value(v, self.redact, keys=False) for k, v in event_dict.items()}


def redact_value(value: Any, redact: Callable[[str], str], *, keys: bool = True) -> Any:
    """Apply `redact` to every string of a JSON-like value (its keys too, unless `keys` is False)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {(redact(str(k)) if keys else k): redact_value(v, redact, keys=keys) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(v, redact, keys=keys) for v in value]
    return value
