"""`manage.py doctor`: check the configuration end to end, one line per check, with the fix.

Most first-day failures are configuration, and each shows up only when the first job runs. Here
every seam a job uses is tried once, read-only or in throw-away state: the database and its
schema, the broker, each configured forge, the model endpoint, the sandbox and free disk.

- `results.py`: what a check reports (the result type, the options, passed/failed/warned/skipped).
- `checks.py`: the runner (every group of checks in its own thread with a deadline, so no check can
  hang doctor); it imports the check modules, which import only `results.py`.
- `system.py`: database, broker, disk. `forges.py`: GitLab and Gitea. `model.py`: the model
  endpoint and its SGLang launch flags. `sandboxes.py`: bubblewrap isolation and cgroups, or the
  Kubernetes namespace, RBAC and deny-all policy.

Every detail and fix is scrubbed of the configured secrets before it is shown.
"""

from worker.commands.doctor.checks import exit_code, render_text, run_doctor
from worker.commands.doctor.results import CheckResult

__all__ = ["CheckResult", "exit_code", "render_text", "run_doctor"]
