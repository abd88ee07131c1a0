// The stand-in "hypervisor" of a VM that needs a socket server: cloud-image and Windows VMs
// (console.sock: SAC or a Linux login prompt), and any VM when guest.serveVsock is on
// (vsock.uds: `CONNECT <port>\n` ⇒ `OK <n>\n`); and of every VM booted while the `standin`
// knob is set, which it follows: it burns `cpuMillicores` of one core and holds `rssMiB` of
// touched memory, re-reading the knobs every second (what /proc shows for the "VM", so the
// daemon's stats and `kubectl top` have something to follow). Other VMs' stand-in is a plain
// `sleep`. It keeps its cgroup scope's cpu.stat current (sim/cgroup.ts) when given one.
// Usage: node standin.ts <root> <vm id> [<scope dir>]. Runs until killed (or until the root
// disappears).
import fs from 'node:fs';
import module from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { followScope } from './cgroup.ts';
import { readGuest } from './guest.ts';
import { loadKnobs, re } from './knobs.ts';
import { runDir } from './paths.ts';
import { serveConsole } from './sac.ts';

const [root, vmId, scope] = process.argv.slice(2);
if (!root || !vmId) {
  process.stderr.write('usage: standin.ts <root> <vm id> [<scope dir>]\n');
  process.exit(2);
}
// Long-lived and killed, never exiting normally: write the compile cache now, or every
// stand-in would pay for TypeScript stripping (and its ~12 MB) forever.
module.flushCompileCache?.();
const guest = readGuest(root, vmId);
if (!guest) {
  process.stderr.write(`standin: no guest state for ${vmId}\n`);
  process.exit(1);
}
process.title = guest.dir === 'firecracker' ? 'firecracker' : 'cloud-hypervisor';
const log = (msg: string) => process.stdout.write(`${new Date().toISOString()} ${msg}\n`);
const rd = runDir(root, guest.dir, vmId);
const knobs = await loadKnobs(root).catch(() => ({}) as Awaited<ReturnType<typeof loadKnobs>>);

function listen(file: string, onConn: (s: net.Socket) => void): void {
  fs.rmSync(file, { force: true });
  const server = net.createServer(onConn);
  server.on('error', (e) => log(`listen ${path.basename(file)}: ${e.message}`));
  server.listen(file);
}

if (guest.imageType === 'cloudimg' || guest.windows) {
  listen(path.join(rd, 'console.sock'), (s) =>
    serveConsole(s, { root, vmId, windows: guest.windows, name: guest.name }),
  );
}
if (knobs.guest?.serveVsock) {
  listen(path.join(rd, 'vsock.uds'), (s) => {
    let buf = '';
    s.on('error', () => s.destroy());
    s.on('data', (d: Buffer) => {
      buf += d.toString('latin1');
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      const m = /^CONNECT (\d+)$/.exec(buf.slice(0, nl).trim());
      if (m) s.write(`OK ${1_073_741_824 + Number(m[1])}\n`);
      else s.end();
    });
  });
}
log(`vm ${vmId} (${guest.name}) running`);
// The scope the starting call creates (right after this process started) and removes when it
// kills us: its CPU is this process's (and its children's), as the kernel would count it.
if (scope) followScope(scope, process.pid);

type Load = { cpuMillicores: number; rssMiB: number };
/** The load of this VM: per field, the first `vms` entry matching its name that sets it, else
 * the top-level value, else 0. */
function loadFor(k: Awaited<ReturnType<typeof loadKnobs>>): Load | undefined {
  const s = k.standin;
  if (!s) return undefined;
  const name = guest?.name ?? '';
  const hits = (s.vms ?? []).filter((e) => re(e.match).test(name));
  const pick = (f: keyof Load): number => hits.find((e) => e[f] !== undefined)?.[f] ?? s[f] ?? 0;
  return { cpuMillicores: pick('cpuMillicores'), rssMiB: pick('rssMiB') };
}
const MiB = 1 << 20;
const held: Buffer[] = [];
let load: Load = { cpuMillicores: 0, rssMiB: 0 };
function applyLoad(next: Load): void {
  if (next.cpuMillicores !== load.cpuMillicores || next.rssMiB !== load.rssMiB)
    log(`load: ${next.cpuMillicores}m CPU, ${next.rssMiB} MiB held`);
  load = next;
  // Filled (not just allocated), so every page is resident.
  while (held.length < load.rssMiB) held.push(Buffer.alloc(MiB, held.length % 251 || 1));
  held.length = Math.min(held.length, load.rssMiB);
}
if (knobs.standin) {
  applyLoad(loadFor(knobs) ?? load);
  setInterval(() => {
    loadKnobs(root)
      .then((k) => applyLoad(loadFor(k) ?? { cpuMillicores: 0, rssMiB: 0 }))
      .catch(() => {});
  }, 1000);
  // Busy until cpuMillicores/10 ms of CPU time are used in every 100 ms window (CPU time, not
  // wall time: on a loaded host the spin lasts longer instead of the share coming out lower).
  const tick = () => {
    const start = performance.now();
    const wantUsec = load.cpuMillicores * 100;
    if (wantUsec > 0) {
      const c0 = process.cpuUsage();
      while (performance.now() - start < 100) {
        const c = process.cpuUsage(c0);
        if (c.user + c.system >= wantUsec) break;
      }
    }
    setTimeout(tick, Math.max(1, 100 - (performance.now() - start)));
  };
  tick();
}
// Exit when the root disappears (a test removed it without killing us).
setInterval(() => {
  if (!fs.existsSync(root)) process.exit(0);
}, 30_000);
