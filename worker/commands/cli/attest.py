"""The attestation commands: `attest keygen`, `attest revoke` and `verify` (app/attestations)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from worker.commands.cli.common import cli, fail, load_settings

attest = typer.Typer(no_args_is_help=True, help="The installation's attestation key: keygen, revoke.")
cli.add_typer(attest, name="attest")


@attest.command()
def keygen(
    private: Annotated[
        Path | None, typer.Option("--private", help="Where to write the private key (default FROGFIX_ATTESTATION_KEY).")
    ] = None,
) -> None:
    """Write a new Ed25519 key pair: the private key (mode 0600, never over a file) and its public key in the
    trusted folder; prints the key id and the public key's path, never the private key."""
    from app.attestations import keys

    settings = load_settings()
    target = private or settings.attestation_key
    if target is None:
        fail("attest keygen", "set FROGFIX_ATTESTATION_KEY (or --private) to where the private key goes", 2)
    if target.exists():
        fail("attest keygen", f"{target} exists; FrogFix never overwrites a key (rotate: a new file, then the setting)")
    trusted = settings.resolved_trusted_keys()
    kid = keys.keygen(target, trusted)
    typer.echo(f"key id {kid}\nprivate key {target} (mode 0600)\npublic key {trusted / (kid + '.pub')}")


@attest.command()
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key id to revoke (its statements from now on fail verify).")],
    at: Annotated[str | None, typer.Option(help="When it was revoked, ISO 8601 with a zone (default: now).")] = None,
) -> None:
    """Record a key as revoked: what it signed from then on fails `verify`; its public key stays."""
    from app.attestations import keys

    try:
        when = datetime.fromisoformat(at) if at else datetime.now(UTC)
    except ValueError:
        fail("attest revoke", f"{at!r} is not an ISO 8601 time", 2)
    if when.tzinfo is None:
        fail("attest revoke", "give the time with its zone (e.g. 2026-12-05T22:00:00+00:00)", 2)
    keys.revoke(load_settings().resolved_trusted_keys(), key_id.strip(), when)
    typer.echo(f"revoked {key_id.strip()} from {when.isoformat()}")


@cli.command()
def verify(
    bundle: Annotated[Path, typer.Argument(help="A bundle from /api/jobs/{id}/attestations.")],
    key: Annotated[Path | None, typer.Option("--key", help="The one public key (PEM) to trust.")] = None,
    checkout: Annotated[Path | None, typer.Option("--checkout", help="A clone to check the commits in.")] = None,
    log: Annotated[Path | None, typer.Option("--log", help="The installation's attestations/log.jsonl.")] = None,
    replay: Annotated[bool, typer.Option("--replay", help="Replay each change from the bundle, no model server.")]
    = False,
) -> None:
    """Check a bundle: signature and key id, revocation, patch, trajectory, the log's chain, with
    --checkout the commits, with --log the installation's whole log, and with --replay each change
    replayed from its recorded replies (the base commit from --checkout, else from the repository).
    One line a check; exit 1 exactly when one fails, 2 for unusable input."""
    from app.attestations.keys import AttestationKeyError
    from app.attestations.verify import exit_code
    from worker.commands.verify import run_verify

    try:
        data = json.loads(bundle.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        fail("verify", f"{bundle} is not a readable JSON bundle: {exc}", 2)
    if not isinstance(data, dict):
        fail("verify", f"{bundle} is not a bundle", 2)
    try:
        settings = load_settings()
        checks = run_verify(data, settings.resolved_trusted_keys(), key, checkout, log)
    except AttestationKeyError as exc:
        fail("verify", str(exc), 2)
    except (OSError, ValueError) as exc:  # the log file
        fail("verify", f"{log} is not a readable log: {exc}", 2)
    if replay:
        from worker.commands.bundle_replay import replay_checks

        checks += replay_checks(data, settings, checkout)
    for check in checks:
        typer.echo(check.line())
    failed = sum(1 for c in checks if c.outcome == "fail")
    typer.echo(f"{len(checks) - failed} passed, {failed} failed")
    raise typer.Exit(exit_code(checks))
