#!/usr/bin/env bash
# Runs the whole test suite. Tests start their own PostgreSQL, Redis and servers on 127.0.0.1.
# It runs in the checkout's .venv (made by ./install.sh) when there is one, else with python3.
#
# Two phases, with the same arguments: first every test not marked `serial`, spread over two
# pytest-xdist workers per CPU (most tests wait on sandboxes, servers and subprocesses, not on the
# CPU; FROGFIX_TEST_WORKERS sets how many, 0 runs them in this process; an idle worker takes
# tests queued for a busy one), then the `serial` ones alone: they watch machine-wide state that
# another test process's sandboxes could change (a killed worker's cgroups, which any sandbox
# start reaps).
set -uo pipefail
cd "$(dirname "$0")"
python=python3
[ -x .venv/bin/python ] && python=.venv/bin/python
workers="${FROGFIX_TEST_WORKERS:-$(( $(nproc) * 2 ))}"
spread=()
if [ "$workers" != 0 ] && "$python" -c "import xdist" 2>/dev/null; then
  spread=(-n "$workers" --dist worksteal)
fi
FROGFIX_TEST_PHASE=parallel "$python" -m pytest "${spread[@]}" "$@"
first=$?
FROGFIX_TEST_PHASE=serial "$python" -m pytest "$@"
second=$?
# 5 is pytest's "no tests collected": one phase may have none (a path with no serial test), never both.
if [ "$first" -eq 5 ] && [ "$second" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
for rc in "$first" "$second"; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    exit "$rc"
  fi
done
exit 0
