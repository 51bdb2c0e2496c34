"""One attempt and the evidence about it: the agent's run, its patch, the tests, the verdict.

- `attempt`: one attempt, owned in one place (workspace, `.frogfix.yml` and AGENTS.md guidance,
  trajectory, sandbox, Leaf, patch, review rules, verification): `AttemptRunner`, `AttemptSpec`,
  `AttemptResult`; the job core, `fix`, replay and eval all run attempts through it.
- `verifier`: the test runs (the base run once per job, the patched runs, the reproduction) and
  `TestRun`/`TestEvidence`, the data types the MR text, the record and the API read.
- `evidence`: the one verdict (levels, fail-to-pass, pass-to-fail); `run_checks` and
  `evidence_plugin`: the per-test results channel out of the test process and its forgery checks.
- `stored_patch`: the patch as git stores it, taken outside the sandbox; `ci_config`: which paths
  are CI configuration; `reach_in`: how a patch reaches into the test runner.
- `frogfix_yml`: `.frogfix.yml` as pydantic models (the one home of its keys, types, rules and
  defaults; each problem named by key, YAML line and column, with a "did you mean").
- `repo_config`: what a job takes from the repository: `.frogfix.yml`, AGENTS.md guidance,
  test-command detection, review rules.

Room rule (tests/test_import_graph.py): may import `worker.git`, `worker.environment`,
`worker.leaf` and `worker.wiring`; never the job core, the texts or the commands above it.
"""
