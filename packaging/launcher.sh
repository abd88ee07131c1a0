#!/bin/sh
# vk-cocoon release launcher (bin/vk-cocoon of the release tarball; scripts/release.sh copies
# it there). Runs the daemon on the Node.js 24 runtime shipped in the release (runtime/node),
# never a node from PATH, from wherever the release was unpacked (symlinks to this file are
# followed, so /usr/local/bin/vk-cocoon -> /opt/vk-cocoon/current/bin/vk-cocoon works).
#
# The sources were stripped of their TypeScript types at build time (lib/src/*.js) and bundled
# into one module (lib/bundle/vk-cocoon.js; packaging/bundle.ts), so no type stripper is
# loaded and no cache warm-up is needed (docs/decisions.md "Release artifact"); with
# NODE_OPTIONS=--enable-source-maps a stack trace names lib/src positions, which are those of
# src/*.ts. NODE_COMPILE_CACHE keeps V8's code cache between starts: by default the unit's
# CacheDirectory (systemd sets CACHE_DIRECTORY), else ~/.cache/vk-cocoon. The V8 flags are
# the checkout's (bin/vk-cocoon says why): a 2 MB young-generation semi-space, bytecode only
# (no baseline or optimizing compiler), and the old generation collected sooner
# (docs/decisions.md "Daemon memory").
here="$(dirname "$(readlink -f "$0")")/.."
if [ -z "${NODE_COMPILE_CACHE:-}" ]; then
  NODE_COMPILE_CACHE="${CACHE_DIRECTORY:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/vk-cocoon}/node-compile-cache"
fi
export NODE_COMPILE_CACHE
exec "$here/runtime/node" --max-semi-space-size=2 --no-opt --no-maglev --no-sparkplug --optimize-for-size "$here/lib/bundle/vk-cocoon.js" "$@"
