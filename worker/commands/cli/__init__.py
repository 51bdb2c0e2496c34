"""manage.py's commands (manage.py is a thin entry): `common` holds the Typer app and what the
commands share; `service`, `jobs`, `runs` and `operators` register their commands on it when imported here."""

from worker.commands.cli import jobs, operators, runs, service
from worker.commands.cli.common import cli

__all__ = ["cli", "jobs", "operators", "runs", "service"]
