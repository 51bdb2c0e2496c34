"""structlog set-up: JSON lines, every line carrying the delivery or job it concerns, secrets redacted."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import structlog

REDACTED = "[REDACTED]"


class SecretRedactor:
    """A structlog processor (and a plain callable) that replaces every configured secret value."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def redact(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def _scrub(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self._scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self._scrub(v) for v in value]
        return value

    def __call__(self, _logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        if not self.secrets:
            return event_dict
        return {k: self._scrub(v) for k, v in event_dict.items()}


def configure_logging(level: str = "INFO", secrets: Iterable[str] = (), stream: Any = None) -> SecretRedactor:
    """Route structlog and stdlib logging to one JSON stream; returns the redactor in use."""
    redactor = SecretRedactor(secrets)
    out = stream or sys.stderr
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            *shared,
            structlog.processors.format_exc_info,
            redactor,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                redactor,
                structlog.processors.JSONRenderer(),
            ],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "kombu", "amqp"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # The embedded (filesystem) broker has no host name, and kombu warns about it on every connection.
    logging.getLogger("kombu.connection").setLevel(logging.ERROR)
    return redactor


def get_logger(name: str = "frogfix") -> Any:
    return structlog.get_logger(name)
