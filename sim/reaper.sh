#!/usr/bin/env bash
# Parent and reaper of the simulator's long-lived processes for one root (docs/simulator.md,
# "Stand-ins"). This machine's pid 1 does not reap orphans, so a stand-in that is not somebody's
# child would linger as a zombie after being killed (and look alive to kill(pid, 0)). This shell
# starts them instead and, being their parent, reaps them.
#
# Requests arrive on <simdir>/reaper.fifo, one tab-separated line each (written atomically):
#   <request id> <log file> <argv0> <command> [args...]
# The command runs in its own process group (job control) with stdin from /dev/null and
# stdout/stderr appended to the log file; its pid is written to <simdir>/reaper/<request id>.
# The reaper exits (killing its children) on SIGTERM or when <simdir> disappears.
set -m
simdir=$1
fifo=$simdir/reaper.fifo
resp=$simdir/reaper
mkdir -p "$resp" || exit 1
rm -f "$fifo"
mkfifo -m 0600 "$fifo" || exit 1
exec 3<>"$fifo" </dev/null
kill_jobs() { for p in $(jobs -p); do kill -9 -- "-$p" 2>/dev/null; done; }
trap 'kill_jobs; exit 0' TERM INT
echo "$$" >"$simdir/reaper.ready"
ticks=0
while :; do
  # A short timeout: bash reaps finished children only between builtins.
  if IFS=$'\t' read -r -t 0.25 -a req <&3; then
    [ "${#req[@]}" -ge 4 ] || continue
    (exec -a "${req[2]}" "${req[@]:3}") >>"${req[1]}" 2>&1 &
    echo "$!" >"$resp/${req[0]}"
  else
    ticks=$((ticks + 1))
    if [ $((ticks % 40)) -eq 0 ]; then
      jobs -n >/dev/null
      if [ ! -d "$simdir" ]; then
        kill_jobs
        exit 0
      fi
    fi
  fi
done
