"""The job core: one run of a job, from admission to its ending, and the rounds on its MR.

- `runs`: which pipeline a claimed job gets; `pipeline`: one run of one job, stage by stage
  (admit, prepare, attempts, choose, publish, end), with no Celery inside; `job_context`: what a
  run holds beside its stages (its seams, the cancel and preempt flags, `Prepared`, `JobEnded`).
- `attesting`: signing what a run publishes (the `Assisted-by` trailer, the change's statement signed
  before the push, kept with the job and in the log after it; FROGFIX_REQUIRE_ATTESTATION).
- `question`: asking the issue's author one question when the issue is unclear.
- `mr_rounds`: review, CI and update rounds on an MR FrogFix opened, and the MR's rounds
  section; `triage`: each round request judged once.

Room rule (tests/test_import_graph.py): may import `worker.attempts`, `worker.texts`,
`worker.git`, `worker.environment`, `worker.leaf` and `worker.wiring`; never the commands.
"""
