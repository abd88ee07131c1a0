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
# A read that times out mid-line keeps what it read (bash saves partial input on a timeout):
# it is carried into the next read, never parsed alone. Without this a loaded machine cut
# requests in two and lost both halves (a stand-in never started, its VM seen dead).
partial=''
while :; do
  # A short timeout: bash reaps finished children only between builtins.
  line=''
  if IFS= read -r -t 0.25 line <&3; then
    line=$partial$line
    partial=''
    IFS=$'\t' read -r -a req <<<"$line"
    [ "${#req[@]}" -ge 4 ] || continue
    (exec -a "${req[2]}" "${req[@]:3}") >>"${req[1]}" 2>&1 &
    echo "$!" >"$resp/${req[0]}"
  else
    partial=$partial$line
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
