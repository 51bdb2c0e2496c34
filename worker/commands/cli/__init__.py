"""manage.py's commands (manage.py is a thin entry): `common` holds the Typer app and what the
commands share; `service`, `jobs`, `runs`, `operators` and `attest` register their commands on it when imported
here."""

from worker.commands.cli import attest, jobs, operators, runs, service
from worker.commands.cli.common import cli

__all__ = ["attest", "cli", "jobs", "operators", "runs", "service"]
