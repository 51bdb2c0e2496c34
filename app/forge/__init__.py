"""The forges, in two halves that share nothing but this package.

- The webhook half, pure functions of (headers, body, secret) with no I/O: `webhook.py` (the
  normalised event, what it asks of FrogFix, the errors, signature helpers), `gitlab_webhook.py`
  and `gitea_webhook.py` (one parser each; Forgejo speaks Gitea's).
- The API half, used by the worker once a job runs: `api.py` (the `Forge` protocol, its errors,
  outbound-text rules, post-once comments, the one draft MR per job), `gitlab_api.py`
  (python-gitlab), `gitea_api.py` (Gitea's REST API over httpx) and `retry.py` (bounded retries).

This package imports nothing else of FrogFix.
"""
