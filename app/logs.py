"""structlog set-up: JSON lines, every line carrying the delivery or job it concerns, secrets redacted."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import Any

import structlog

from app.redaction import SecretRedactor


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
