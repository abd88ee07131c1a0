#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine. Idempotent and quick when warm.
#  - npm dependencies, including Node.js 24 from the npm registry (node_modules/.bin/node)
#  - Debian's docker-registry (CNCF distribution 2.8), for what needs its quirks (a standalone
#    one in registry-push.test.ts, bench/transfer.ts) and VK_REGISTRY_KIND=docker-registry
#  - Debian's systemd (systemd-analyze verify of the release's unit file)
#  - Debian's fping (the daemon's ICMP readiness probe) and iproute2 (the simulator's guest
#    network namespaces, whose addresses answer it)
#  - kube-apiserver, etcd and kubectl built from the Go module proxy (cached outside the repo)
#  - the CNCF distribution v3 registry, the ground's default OCI registry, built the same way
#  - the cocoon simulator's thin Go client (node_modules/.cache/vk-cocoon/, rebuilt when its
#    source changes; without Go the simulator falls back to one Node process per call)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
say() { echo "setup: $*" >&2; }
lock_hash="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ ! -x node_modules/.bin/node ] || [ "$(cat node_modules/.vk-lock-hash 2>/dev/null)" != "$lock_hash" ]; then
  say "installing npm dependencies (Node.js 24 comes from the npm registry)"
  npm ci --no-audit --no-fund >&2
  echo "$lock_hash" > node_modules/.vk-lock-hash
fi
v="$(node_modules/.bin/node --version)"
case "$v" in v24.*) ;; *) say "node_modules/.bin/node is $v, expected v24"; exit 1 ;; esac
# Unit tests need Node.js 24 and the npm packages only (scripts/test.sh sets this for them).
if [ -n "${VK_SETUP_NODE_ONLY:-}" ]; then exit 0; fi
if ! command -v docker-registry >/dev/null; then
  say "installing Debian's docker-registry"
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry) >&2
  else
    say "docker-registry is missing: run 'sudo apt-get install docker-registry'"; exit 1
  fi
fi
# systemd-analyze verifies the release's unit file (test/integration/release.test.ts).
if ! command -v systemd-analyze >/dev/null; then
  say "installing Debian's systemd (for systemd-analyze verify of the release unit)"
  if [ "$(id -u)" = 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd) >&2
  else
    say "systemd-analyze is missing: run 'sudo apt-get install systemd'"; exit 1
  fi
fi
# fping sends the readiness probe's ICMP echo (src/net/icmp.ts); iproute2's `ip` makes the
# simulator's guest network namespaces (sim/guestnet.ts), whose guests answer it.
for pkg in fping:fping ip:iproute2; do
  if ! command -v "${pkg%%:*}" >/dev/null; then
    say "installing Debian's ${pkg#*:} (readiness probes by ICMP)"
    if [ "$(id -u)" = 0 ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${pkg#*:}") >&2
    else
      say "${pkg%%:*} is missing: run 'sudo apt-get install ${pkg#*:}'"; exit 1
    fi
  fi
done
command -v openssl >/dev/null || { say "openssl is required (apt-get install openssl)"; exit 1; }
bash scripts/testbin.sh >/dev/null
# Progress (or "cached registry ...") on stderr; the cache dir on stdout is not needed here.
bash scripts/distributionbin.sh >/dev/null
bash sim/client-go/build.sh
