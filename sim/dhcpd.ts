// The simulator's DHCP server for one root, playing cocoon-net's part: it grants each guest's
// lease once boot + dhcp.leaseDelayMs has passed (unless the guest is blocked; see guest.ts).
// One long-lived process per root, started on demand by the first VM that boots with a lease
// delay (a per-VM short-lived grant process would cost ~0.2 CPU-s per VM). Zero-delay leases
// and leases unblocked by guest commands are granted by the invoking CLI process itself.
// Usage: node dhcpd.ts <root> <leases file>. Exits when the root disappears.
import fs from 'node:fs';
import module from 'node:module';
import path from 'node:path';
import { readVmDb } from './db.ts';
import { blocker, dhcpSync, readGuest } from './guest.ts';
import { type Knobs, loadKnobs } from './knobs.ts';

module.flushCompileCache?.(); // long-lived and killed: persist the compile cache now

const [root, leases] = process.argv.slice(2);
if (!root || !leases) {
  process.stderr.write('usage: dhcpd.ts <root> <leases file>\n');
  process.exit(2);
}
process.title = 'cocoon-net';
const guestsDir = path.join(root, 'sim', 'guests');
fs.mkdirSync(guestsDir, { recursive: true });
const log = (msg: string) => process.stdout.write(`${new Date().toISOString()} dhcpd: ${msg}\n`);

/** Guest files known not to need anything, by mtime (re-read only when they change). */
const settled = new Map<string, number>();
let timer: NodeJS.Timeout | undefined;
let nextAt = Number.POSITIVE_INFINITY;
let running = false;
let again = false;

async function pass(): Promise<void> {
  if (running) {
    again = true;
    return;
  }
  running = true;
  try {
    const knobs: Knobs = await loadKnobs(root as string).catch(() => ({}));
    const now = Date.now();
    let next = Number.POSITIVE_INFINITY;
    let names: string[] = [];
    try {
      names = fs.readdirSync(guestsDir).filter((n) => n.endsWith('.json'));
    } catch {
      // root removed under us: the interval below exits
    }
    for (const file of names) {
      const id = file.slice(0, -5);
      let mtime = 0;
      try {
        mtime = fs.statSync(path.join(guestsDir, file)).mtimeMs;
      } catch {
        continue; // removed meanwhile
      }
      if (settled.get(id) === mtime) continue;
      const g = readGuest(root as string, id);
      if (!g || g.dhcpDone || !g.nics.some((n) => n.dhcp)) {
        settled.set(id, mtime);
        continue;
      }
      if (g.leaseAt > now) {
        next = Math.min(next, g.leaseAt);
        continue;
      }
      // Blocked guests (wedge, PnP, release, never) are looked at again on the next pass;
      // checking first avoids taking the guest lock (and waking our own watch) for nothing.
      if (blocker(g, knobs, now)) continue;
      try {
        const res = dhcpSync(root as string, leases as string, id, knobs);
        if (res.granted.length > 0) {
          log(`${g.name}: ${res.granted.map((x) => `${x.ip} to ${x.mac}`).join(', ')}`);
        } else if (res.blocked === 'vm not running') {
          const vm = readVmDb(root as string, g.dir).vms[id];
          if (vm && (vm.state === 'creating' || vm.state === 'created')) next = Math.min(next, now + 100);
        }
      } catch (e) {
        log(`${g.name}: ${(e as Error).message}`);
        next = Math.min(next, now + 500);
      }
    }
    const present = new Set(names);
    for (const id of settled.keys()) if (!present.has(`${id}.json`)) settled.delete(id);
    schedule(next);
  } finally {
    running = false;
    if (again) {
      again = false;
      void pass();
    }
  }
}

function schedule(at: number): void {
  if (at === nextAt && timer) return;
  clearTimeout(timer);
  nextAt = at;
  if (Number.isFinite(at)) timer = setTimeout(() => void pass(), Math.max(0, at - Date.now()) + 2);
}

let debounce: NodeJS.Timeout | undefined;
fs.watch(guestsDir, (_event, file) => {
  // Only guest state files (not their lock or temp files) matter.
  if (file && !file.endsWith('.json')) return;
  clearTimeout(debounce);
  debounce = setTimeout(() => void pass(), 50);
});
// Safety net: blocked guests and missed watch events are re-evaluated every 2 s.
setInterval(() => void pass(), 2000);
setInterval(() => {
  if (!fs.existsSync(root)) process.exit(0);
}, 5000);
log(`serving ${root}, leases ${leases}`);
void pass();
