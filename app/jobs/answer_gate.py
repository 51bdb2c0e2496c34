"""Who may answer FrogFix's question with `/frogfix`, asked of the forge while the comment's delivery is
recorded, and the one reply a refused person gets on an issue (issue 36).

The webhook otherwise never calls the forge. These are its only calls, and only for a `/frogfix` comment
on an issue whose job asked a question and waits for the answer (or runs): one membership read, the same
`can_trigger` (GitLab Developer, Gitea/Forgejo write) that the worker's admission and the review triage
ask, and one comment the first time a person is refused on an issue (app/jobs/intake.py remembers who was
told). Each call has a short timeout and no retry, so the delivery is still answered quickly; when the
forge cannot tell, intake does what it did before issue 36 and the worker's admission decides.
Nothing here raises: a forge or client failure is an unknown (None) or an untold reply (False).
"""

from __future__ import annotations

from typing import Any, Final

from app.forge.api import Forge, ForgeError
from app.logs import get_logger
from app.redaction import SecretRedactor
from app.retrying import RetryPolicy
from app.settings import get_settings

log = get_logger("frogfix.answer_gate")

INTAKE_FORGE_TIMEOUT_S: Final = 5.0  # one call; forges give up on a webhook after 5-10 s
# The one reply to a refused `/frogfix`: fixed words, no mention (anyone can comment, and each mention
# notifies), said once per person and issue.
REFUSED_REPLY: Final = (
    "FrogFix did not try again: only members with at least Developer (write) access to this project can ask"
    " it to with `/frogfix`. A member's `/frogfix` runs it with the comments written since its question."
    " (FrogFix says this once per person on this issue.)"
)


def intake_forge(kind: str) -> Forge:
    """A forge client for the webhook: the worker's settings, a short timeout, no retry."""
    s = get_settings()
    options: dict[str, Any] = {
        "redact": SecretRedactor(s.secret_values()).redact,
        "timeout": min(s.forge_timeout_seconds, INTAKE_FORGE_TIMEOUT_S),
        "retry": RetryPolicy(attempts=1, budget_s=INTAKE_FORGE_TIMEOUT_S),
    }
    if kind == "gitlab":
        from app.forge.gitlab_api import GitLabForge

        return GitLabForge(s.gitlab_url, s.gitlab_token.get_secret_value(), **options)
    if kind == "gitea":
        from app.forge.gitea_api import GiteaForge

        return GiteaForge(s.gitea_url, s.gitea_token.get_secret_value(), **options)
    raise ForgeError(f"unknown forge {kind!r}")


def may_answer(kind: str, project: str, username: str) -> bool | None:
    """Whether `username` may trigger FrogFix on `project`; None when the forge could not tell."""
    try:
        forge = intake_forge(kind)
    except Exception as exc:  # no URL or token in this process, an unknown forge
        log.info("answer_member_unknown", project=project, user=username, error=str(exc)[:300])
        return None
    try:
        return bool(forge.can_trigger(project, username))
    except Exception as exc:  # ForgeError, or a client's bug: the worker's admission asks again
        log.warning("answer_member_unknown", project=project, user=username, error=str(exc)[:300])
        return None
    finally:
        forge.close()


def tell_refused(kind: str, project: str, issue: int) -> bool:
    """Post REFUSED_REPLY on the issue; False when it could not be posted."""
    try:
        forge = intake_forge(kind)
    except Exception as exc:
        log.warning("answer_refusal_untold", project=project, issue=issue, error=str(exc)[:300])
        return False
    try:
        forge.comment(project, issue, REFUSED_REPLY)
        return True
    except Exception as exc:
        log.warning("answer_refusal_untold", project=project, issue=issue, error=str(exc)[:300])
        return False
    finally:
        forge.close()
