#!/usr/bin/env bash
# Installs everything FrogFix and its tests need on a fresh Debian machine (run as root or with sudo):
# Debian's packages for the services and the sandbox, and FrogFix with its Python dependencies in a
# virtual environment inside the checkout (.venv/), made with the system python3. pip never touches
# the system interpreter. Running it again is quick: pip runs only when pyproject.toml changed
# since the last install that finished, and .venv is made again when its interpreter is gone.
set -euo pipefail
cd "$(dirname "$0")"

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

apt_install() {
  # apt waits up to two minutes for a dpkg lock another package manager holds (unattended-upgrades, often
  # right after boot); a lock still held then, or any other failure, ends install.sh with apt's message
  # and one line saying what to do, instead of apt's bare exit code.
  echo "install.sh: installing $*"
  local said status=0 APT_LOCK_WAIT_S=120
  said=$(mktemp)
  { $SUDO apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT_S" update -qq &&
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$APT_LOCK_WAIT_S" \
      install -y -qq "$@" >/dev/null; } 2>"$said" || status=$?
  if [ "$status" -ne 0 ]; then
    cat "$said" >&2
    if grep -q -e "Could not get lock" -e "Unable to acquire the dpkg" -e "is held by process" "$said"; then
      echo "install.sh: another package manager holds the dpkg lock (apt's message above names it); wait until it" \
        "finishes, then run ./install.sh again" >&2
    else
      echo "install.sh: apt-get could not install $* (exit $status; apt's message is above)" >&2
    fi
    rm -f "$said"
    exit "$status"
  fi
  rm -f "$said"
}

missing=()
command -v git >/dev/null || missing+=(git)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v chromium >/dev/null || missing+=(chromium)
command -v runuser >/dev/null || missing+=(util-linux)
# the local sandbox runs target repositories' tests with the system python3
/usr/bin/python3 -c "import pytest" 2>/dev/null || missing+=(python3-pytest)
# JavaScript repositories' environments, and the tests' npm registry (Verdaccio, tests/npm_registry.py)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if ! command -v initdb >/dev/null && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
  missing+=(postgresql)
fi
if [ ${#missing[@]} -gt 0 ]; then
  apt_install "${missing[@]}"
fi

stamp=.venv/.frogfix-installed
want="$PWD $(sha256sum pyproject.toml | cut -d' ' -f1)"  # a moved checkout reinstalls too
if [ -e .venv ] && ! .venv/bin/python -c "import pip" 2>/dev/null; then
  echo "install.sh: .venv's interpreter or its pip is gone; making .venv again"
  rm -rf .venv
elif [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "install.sh: ready (.venv is up to date)"
  exit 0
fi
if [ ! -e .venv ] && ! python3 -m venv .venv; then
  # Debian ships venv's pip bootstrap (ensurepip) separately, in python3-venv.
  rm -rf .venv
  apt_install python3-venv
  python3 -m venv .venv
fi
rm -f "$stamp"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[dev]"
echo "$want" >"$stamp"
echo "install.sh: ready (FrogFix and its dependencies in .venv; ./manage.py and ./test.sh use it)"
