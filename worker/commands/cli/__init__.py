"""manage.py's commands (manage.py is a thin entry): `common` holds the Typer app and what the
commands share; `service`, `jobs` and `runs` register their commands on it when imported here."""

from worker.commands.cli import jobs, runs, service
from worker.commands.cli.common import cli

__all__ = ["cli", "jobs", "runs", "service"]
