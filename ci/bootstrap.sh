#!/usr/bin/env bash
# Sets up a fresh Debian machine (or a developer's) for the nox sessions: installs nox for
# the current python3. Idempotent; safe to run again.
set -euo pipefail

python=${PYTHON:-python3}
if ! "$python" -m nox --version >/dev/null 2>&1; then
    "$python" -m pip install --quiet --disable-pip-version-check "nox>=2024.3"
fi
"$python" -m nox --version
