#!/bin/sh
# Assemble the agent runtime in $1 (default /opt/loom-runtime): the CPython that runs the
# in-container agent, its standard library, ripgrep, and every shared library they load,
# glibc's dynamic loader included; and tini, the sandbox's init under runc (below). The worker mounts this directory read-only into every
# sandbox (at /.loom) and starts the agent as
#     /.loom/lib/ld-linux-x86-64.so.2 --library-path /.loom/lib /.loom/bin/python3 -I -S ...
# so neither the interpreter nor the C library of the user's image is used: an image with
# no python3, with musl instead of glibc, or with nothing but a static busybox works the
# same. The libraries are found through --library-path (an argument of the loader, not
# LD_LIBRARY_PATH), so nothing leaks into the commands the agent starts.
set -eu
DEST=${1:-/opt/loom-runtime}
PY=$(readlink -f /usr/bin/python3)
VER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
STDLIB=/usr/lib/python$VER
mkdir -p "$DEST/bin" "$DEST/lib"
cp "$PY" "$DEST/bin/python3"
cp "$(command -v rg)" "$DEST/bin/rg"
# The standard library, without what an agent never imports (tests, GUI, 2to3, docs,
# ensurepip's wheels, site-packages) and with Debian's precompiled bytecode kept (start-up).
mkdir -p "$DEST/lib/python$VER"
( cd "$STDLIB" && tar -cf - --exclude=./test --exclude=./idlelib --exclude=./tkinter \
    --exclude=./turtledemo --exclude=./lib2to3 --exclude=./pydoc_data --exclude=./ensurepip \
    --exclude=./site-packages --exclude=./dist-packages --exclude='./config-*' \
    --exclude=./unittest/test --exclude=./distutils --exclude=./venv . ) \
  | tar -C "$DEST/lib/python$VER" -xf -
# Shared libraries: the loader and everything the interpreter, its extension modules and
# ripgrep link against (ldd lists them, the loader included).
for f in "$DEST/bin/python3" "$DEST/bin/rg" "$DEST/lib/python$VER"/lib-dynload/*.so; do
  ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^\t\//{print $1}'
done | sort -u | while read -r lib; do
  cp -L "$lib" "$DEST/lib/"
done
# The sandbox's init (PID 1) under runc: Debian's static tini, the program Docker's own
# `--init` runs, but unreadable (mode 0111). The kernel makes a process that executes a file
# it may not read non-dumpable, and a non-dumpable process cannot be ptrace-attached, nor its
# /proc/<pid>/mem opened, by commands of the same uid (seccomp cannot refuse the latter).
# gVisor reads a program to load it, so under gVisor the engine's own init stays PID 1 (its
# kernel refuses tracing it anyway).
TINI=$(command -v tini-static || true)
[ -n "$TINI" ] || { echo "no tini-static in the base image (Debian package tini)" >&2; exit 1; }
cp "$TINI" "$DEST/bin/tini"
chmod 0111 "$DEST/bin/tini"
"$DEST/bin/tini" -- true
LOADER=$(ls "$DEST"/lib/ld-linux-*.so.* | head -n1)
[ -n "$LOADER" ] || { echo "no dynamic loader found" >&2; exit 1; }
ln -sf "$(basename "$LOADER")" "$DEST/lib/loader"
# A smoke test through the loader, as the worker starts it.
"$DEST/lib/loader" --library-path "$DEST/lib" "$DEST/bin/python3" -I -S -c \
  'import sys, json, ctypes, hashlib, socket, selectors, subprocess, zlib; assert sys.prefix == sys.argv[1], sys.prefix' \
  "$DEST"
"$DEST/lib/loader" --library-path "$DEST/lib" "$DEST/bin/rg" --version >/dev/null
echo "agent runtime: python $VER, $(du -sh "$DEST" | cut -f1) in $DEST"
