// The readiness probe's ICMP cost per probe (docs/decisions.md, "ICMP probes"): the daemon's
// own prober (src/net/icmp.ts: fping, batched) against one `ping` process per probe, the
// mechanism it replaced on paper. Every address is on this machine: as root, guests of a
// simulator guest network (sim/guestnet.ts: a namespace of this bench's own, N answering
// addresses); without root, 127.0.0.0/8 addresses.
//
// Usage: npm run bench:icmp  (or: node bench/icmp.ts [probes per round, default 1 10 100 1000])
//
// Two tables: probes sent at once (a burst of pods coming up: each probe waits at most 10 ms
// for its batch), and ready pods at steady state (N pods each probed every 5 s at a random
// phase for STEADY_S seconds, each echo sent within READY_WINDOW_MS, the daemon's setting,
// against 10 ms to show why the ready window exists).
//
// CPU per probe = (the bench's own CPU + its reaped children's CPU, /proc/self/stat utime,
// stime, cutime, cstime) over a round ÷ probes in the round. Children's time is counted in
// clock ticks (10 ms), so rounds are repeated until they took at least 1 s of CPU in all.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { claimGuestNet, guestNetChange, intToIp, ipToInt, releaseGuestNet } from '../sim/guestnet.ts';
import { silentLogger } from '../src/log.ts';
import { BATCH_WINDOW_MS, IcmpProber, READY_WINDOW_MS } from '../src/net/icmp.ts';
import { machineLines } from './lib/harness.ts';
import { fmtN, markdownTable } from './lib/stats.ts';

const sizes = process.argv.slice(2).map(Number);
if (sizes.some((n) => !Number.isInteger(n) || n < 1 || n > 1000)) {
  console.error('usage: node bench/icmp.ts [probes per round (1..1000) ...]');
  process.exit(2);
}
if (sizes.length === 0) sizes.push(1, 10, 100, 1000);

const TICK_MS = 1000 / 100; // USER_HZ
const STEADY_S = 10;
let steadyT0: number | undefined;
/** The start of the current steady round (set by its first caller). */
function steadyStart(): number {
  steadyT0 ??= performance.now();
  return steadyT0;
}
function sleepUntil(t0: number, offsetMs: number): Promise<void> {
  return new Promise((r) => setTimeout(r, Math.max(0, t0 + offsetMs - performance.now())));
}

/** This process's CPU, its own and its reaped children's, in ms. */
function cpuMs(): { self: number; children: number } {
  const stat = fs.readFileSync('/proc/self/stat', 'latin1');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  const t = (i: number) => Number(f[i]) * TICK_MS;
  return { self: t(11) + t(12), children: t(13) + t(14) };
}

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-bench-icmp-'));
fs.mkdirSync(path.join(root, 'sim'), { recursive: true });
const net = claimGuestNet(root);
const cleanup = () => {
  releaseGuestNet(root);
  fs.rmSync(root, { recursive: true, force: true });
};
process.once('SIGINT', () => {
  cleanup();
  process.exit(130);
});
process.once('SIGTERM', () => {
  cleanup();
  process.exit(143);
});

try {
  const n = Math.max(...sizes);
  const start = ipToInt(net.poolStart);
  const addrs = Array.from({ length: n }, (_, i) => intToIp(start + i));
  guestNetChange(root, { add: addrs });
  console.log(
    `# ${addrs.length} answering addresses in ${net.kind === 'netns' ? `namespace ${net.netns}` : 'loopback'} (${net.subnet})`,
  );

  const prober = new IcmpProber({ timeoutMs: 3000, log: silentLogger });
  const rows: string[][] = [];
  const round = async (label: string, size: number, probe: (ip: string) => Promise<boolean>) => {
    let probes = 0;
    let answered = 0;
    let wall = 0;
    const c0 = cpuMs();
    for (let r = 0; r < 200; r++) {
      const t0 = performance.now();
      const ok = await Promise.all(addrs.slice(0, size).map(probe));
      wall += performance.now() - t0;
      probes += size;
      answered += ok.filter(Boolean).length;
      const c = cpuMs();
      if (c.self + c.children - c0.self - c0.children >= 1000 && r >= 2) break;
    }
    const c1 = cpuMs();
    const self = c1.self - c0.self;
    const children = c1.children - c0.children;
    rows.push([
      label,
      String(size),
      String(probes),
      `${answered}/${probes}`,
      fmtN(wall / (probes / size), 1),
      fmtN(self / probes, 3),
      fmtN(children / probes, 3),
      fmtN((self + children) / probes, 3),
    ]);
    console.log(`# ${label} ×${size}: ${fmtN((self + children) / probes, 3)} ms CPU per probe`);
  };

  for (const size of sizes) await round('fping, batched (the daemon)', size, (ip) => prober.probe(ip));
  const steadyRows: string[][] = [];
  for (const size of sizes.filter((x) => x >= 100)) {
    for (const window of [READY_WINDOW_MS, BATCH_WINDOW_MS]) {
      const c0 = cpuMs();
      let probes = 0;
      let answered = 0;
      await Promise.all(
        addrs.slice(0, size).map(async (ip) => {
          const phase = Math.random() * 5000;
          for (let t = phase; t < STEADY_S * 1000; t += 5000) {
            await sleepUntil(steadyStart(), t);
            probes++;
            if (await prober.probe(ip, window)) answered++;
          }
        }),
      );
      const c1 = cpuMs();
      const cpu = c1.self + c1.children - c0.self - c0.children;
      steadyRows.push([
        String(size),
        `${window} ms`,
        `${answered}/${probes}`,
        fmtN(cpu / probes, 3),
        `${fmtN((cpu / (STEADY_S * 1000)) * 100, 1)} %`,
      ]);
      console.log(
        `# steady ${size} ready pods, window ${window} ms: ${fmtN(cpu / probes, 3)} ms CPU per probe`,
      );
      steadyT0 = undefined;
    }
  }
  const ping = (ip: string) =>
    new Promise<boolean>((resolve) => {
      const c = spawn('ping', ['-c', '1', '-W', '3', '-n', '-q', ip], { stdio: 'ignore' });
      c.once('error', () => resolve(false));
      c.once('close', (code) => resolve(code === 0));
    });
  for (const size of sizes.filter((s) => s <= 100)) await round('ping, one process a probe', size, ping);

  console.log('');
  console.log(
    markdownTable(
      [
        'mechanism',
        'probes at once',
        'probes',
        'answered',
        'ms a round',
        'CPU ms/probe (bench)',
        'CPU ms/probe (children)',
        'CPU ms/probe',
      ],
      rows,
    ),
  );
  console.log('');
  console.log(
    markdownTable(
      ['ready pods (5 s cadence)', 'batch window', 'answered', 'CPU ms/probe', 'CPU (one core = 100 %)'],
      steadyRows,
    ),
  );
  console.log('');
  for (const l of machineLines()) console.log(l);
} finally {
  cleanup();
}
