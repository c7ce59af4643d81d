#!/usr/bin/env bash
# Images that prove "any image works" (the agent brings its own interpreter and libc):
#   loom-test-busybox:latest  nothing but Debian's static busybox (no python, no libc)
#   loom-test-musl:latest     musl as the only C library (Debian's musl), a musl-linked
#                             program, busybox for the shell: Debian packages no musl-linked
#                             shell, and a static busybox has no libc of its own
#   loom-test-nosh:latest     no /bin/sh at all (the worker must refuse it clearly)
#   loom-test-debug:latest    loom-sandbox:latest with strace and gdb: the seccomp profile keeps
#                             tracing one's own children working (tests/docker/test_seccomp.py)
#   loom-test-tmp0755:latest  loom-sandbox:minimal whose /tmp is 0755 and whose $HOME directory is
#                             root's, mode 0500: the sandbox's /tmp must still be 1777 and its
#                             $HOME the user's (tests/docker/test_own_dirs.py)
# Built offline from Debian packages (apt-get download + dpkg-deb -x + docker import, or a
# `docker build` that only copies files in).
# Idempotent: an image labelled with this script's hash is kept.
set -euo pipefail
cd "$(dirname "$0")"
STAMP=$(sha256sum "$(basename "$0")" | cut -c1-16)
have() { [ "$(docker image inspect -f '{{index .Config.Labels "dev.loom.test-image"}}' "$1" 2>/dev/null)" = "$STAMP" ]; }
IMAGES="loom-test-busybox:latest loom-test-musl:latest loom-test-nosh:latest loom-test-debug:latest"
IMAGES="$IMAGES loom-test-tmp0755:latest"
missing=0
for i in $IMAGES; do have "$i" || missing=1; done
if [ "$missing" = 0 ]; then
  echo "[test-images] present"; exit 0
fi
command -v musl-gcc >/dev/null || { apt-get update -q >/dev/null; DEBIAN_FRONTEND=noninteractive apt-get install -y -q musl-tools >/dev/null; }
WORK=$(mktemp -d /tmp/loom-test-images.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
( cd "$WORK" && apt-get download -q busybox-static musl >/dev/null 2>&1 || { apt-get update -q >/dev/null; apt-get download -q busybox-static musl >/dev/null; } )

skeleton() {  # $1: root. /tmp must be 1777: runc gives the tmpfs the mode of the image's /tmp.
  mkdir -p "$1/bin" "$1/etc" "$1/workspace" "$1/root"
  install -d -m 1777 "$1/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nsandbox:x:1000:1000::/home/sandbox:/bin/sh\n' >"$1/etc/passwd"
  printf 'root:x:0:\nsandbox:x:1000:\n' >"$1/etc/group"
}
busybox_into() {  # $1: root, $2: where the applet links go (bin)
  dpkg-deb -x "$WORK"/busybox-static_*.deb "$WORK/bb"
  cp "$WORK/bb/bin/busybox" "$1/bin/busybox"
  for a in $("$1/bin/busybox" --list); do [ -e "$1/bin/$a" ] || ln -s busybox "$1/bin/$a"; done
}
import() {  # $1: root, $2: tag
  tar -C "$1" -c . | docker import --change 'ENV PATH=/usr/local/bin:/bin' --change 'WORKDIR /workspace' \
    --change "LABEL dev.loom.test-image=$STAMP" --change 'CMD ["/bin/sh"]' - "$2" >/dev/null
  echo "[test-images] $2: $(docker image inspect -f '{{.Size}}' "$2" | awk '{printf "%.1f MB", $1/1e6}')"
}

R="$WORK/busybox"; skeleton "$R"; busybox_into "$R"; import "$R" loom-test-busybox:latest

R="$WORK/nosh"; skeleton "$R"; mkdir -p "$R/opt/bb"; cp "$R/../bb/bin/busybox" "$R/opt/bb/busybox"
import "$R" loom-test-nosh:latest

R="$WORK/musl"; skeleton "$R"; busybox_into "$R"
dpkg-deb -x "$WORK"/musl_*.deb "$R"
cat >"$WORK/musl-hello.c" <<'C'
#include <stdio.h>
int main(void) { puts("hello from musl"); return 0; }
C
mkdir -p "$R/usr/local/bin"
musl-gcc -O2 -o "$R/usr/local/bin/musl-hello" "$WORK/musl-hello.c"
if find "$R" -name 'libc.so.6' -o -name 'ld-linux-x86-64.so.2' | grep -q .; then echo "glibc in the musl image" >&2; exit 1; fi
import "$R" loom-test-musl:latest

# strace and gdb on top of loom-sandbox:latest: their packages and the libraries among their
# dependencies that the image lacks, downloaded and unpacked here (the build copies files
# only, no network), then checked: every library they load is found.
R="$WORK/debug"; mkdir -p "$R/root" "$R/debs"
HAVE=$(docker run --rm --network none --entrypoint dpkg-query loom-sandbox:latest -W -f '${Package}\n' | sort -u)
NEED=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
         --no-enhances strace gdb | grep -E '^(strace|gdb|lib[a-z0-9.+-]+)$' | sort -u | comm -23 - <(echo "$HAVE"))
# shellcheck disable=SC2086 # a list of package names
( cd "$R/debs" && apt-get download -q $NEED >/dev/null )
for d in "$R"/debs/*.deb; do dpkg-deb -x "$d" "$R/root"; done
# The image is merged-/usr (/lib, /bin are links into /usr): unpacked top-level directories
# must land under /usr, not replace the links.
for d in lib lib64 bin sbin; do
  if [ -d "$R/root/$d" ] && [ ! -L "$R/root/$d" ]; then
    mkdir -p "$R/root/usr/$d"; cp -a "$R/root/$d/." "$R/root/usr/$d/"; rm -rf "${R:?}/root/$d"
  fi
done
rm -rf "$R"/root/usr/share/doc "$R"/root/usr/share/man "$R"/root/usr/share/locale "$R"/root/usr/share/info
printf 'FROM loom-sandbox:latest\nCOPY root/ /\nLABEL dev.loom.test-image=%s\n' "$STAMP" >"$R/Dockerfile"
DOCKER_BUILDKIT=0 docker build -q -t loom-test-debug:latest "$R" >/dev/null
if docker run --rm --network none --entrypoint sh loom-test-debug:latest -c 'ldd /usr/bin/gdb /usr/bin/strace' \
   | grep 'not found'; then
  echo "[test-images] loom-test-debug: libraries missing" >&2; exit 1
fi
echo "[test-images] loom-test-debug:latest: $(docker image inspect -f '{{.Size}}' loom-test-debug:latest | awk '{printf "%.1f MB", $1/1e6}')"

# /tmp 0755 and a root-owned 0500 $HOME, as some images ship them (runc copies a directory's
# mode onto the tmpfs mounted over it).
R="$WORK/tmp0755"; mkdir -p "$R"
printf '%s\n' "FROM loom-sandbox:minimal" "USER 0" \
  "RUN chmod 0755 /tmp && chown root:root /home/sandbox && chmod 0500 /home/sandbox" \
  "USER 1000:1000" "LABEL dev.loom.test-image=$STAMP" >"$R/Dockerfile"
DOCKER_BUILDKIT=0 docker build -q -t loom-test-tmp0755:latest "$R" >/dev/null
echo "[test-images] loom-test-tmp0755:latest"
