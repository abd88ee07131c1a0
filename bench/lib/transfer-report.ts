// The measuring and printing side of bench/transfer.ts: a command run to completion with its
// peak RSS and CPU sampled from /proc, crane's path, the rows, and the tables printed at the
// end (every row; ours against crane on the registry part; cocoon's export and import apart).
import { spawn } from 'node:child_process';
import path from 'node:path';
import { cpuTimes, memOf } from './procfs.ts';
import { fmtN, markdownTable } from './stats.ts';

const MiB = 2 ** 20;

export type Format = 'v1' | 'v2';

/** What a row measures (the summary pairs them up). */
export type RowKind =
  | 'push'
  | 'registry-push'
  | 'pull'
  | 'registry-pull'
  | 'fetch'
  | 'upload'
  | 'crane-pull'
  | 'crane-push'
  | 'export'
  | 'import';

export interface Row {
  /** The snapshot, e.g. "1 GiB disk, 0.5 GiB data". */
  size: string;
  /** The artifact's format; undefined for the simulator alone. */
  format: Format | undefined;
  kind: RowKind;
  run: number;
  what: string;
  bytes: number;
  ms: number;
  peakKiB: number;
  /** Ours: the transfer process's RSS before the transfer (Node.js and its modules). */
  startKiB: number;
  /** CPU time (user + system) of the transfer process. */
  cpuMs: number;
  /** CPU the registry spent during the phase. */
  registryMs: number;
  /** CPU the simulator spent during the phase (its server and the `cocoon` client processes;
   * for the registry push, the `cat` that streams the tar file). */
  simMs: number;
  note: string;
}

/** What bench/transfer-child.ts prints. */
export interface ChildResult {
  ms: number;
  bytes: number;
  uploadedBytes?: number;
  /** Bytes of the tar a discarded import read. */
  discardedBytes?: number;
  /** The child's RSS before the transfer (Node.js and the modules it loaded). */
  idleKiB: number;
  /** The child's VmHWM at the end: its peak over its whole life. */
  hwmKiB: number;
  /** The child's CPU time (user + system), ms. */
  cpuMs: number;
  /** CPU time of the child's own children (the `cocoon` client processes it ran), ms. */
  childrenCpuMs: number;
}

/**
 * Runs a command to completion; its wall time, peak RSS (VmHWM sampled every 20 ms) and CPU
 * time (utime + stime, the last sample before it exited).
 */
export function measureChild(
  cmd: string,
  args: string[],
): Promise<{ ms: number; peakKiB: number; cpuMs: number }> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let peak = 0;
    let cpuMs = 0;
    let stderr = '';
    child.stderr?.on('data', (d: Buffer) => {
      stderr = (stderr + d.toString()).slice(-4000);
    });
    const timer = setInterval(() => {
      try {
        if (child.pid) {
          // A process that is exiting (a zombie) has no VmHWM: keep the last real samples.
          const hwm = memOf(child.pid).hwmKiB;
          const cpu = cpuTimes(child.pid).selfMs;
          if (Number.isFinite(hwm)) peak = Math.max(peak, hwm);
          if (Number.isFinite(cpu)) cpuMs = cpu;
        }
      } catch {
        // exited
      }
    }, 20);
    child.on('error', reject);
    child.on('close', (code) => {
      clearInterval(timer);
      if (code !== 0) reject(new Error(`${path.basename(cmd)} ${args[0]} exited ${code}: ${stderr.trim()}`));
      else resolve({ ms: performance.now() - t0, peakKiB: peak, cpuMs });
    });
  });
}

/** crane's binary: VK_CRANE_BIN, or the one scripts/cranebin.sh builds and caches. */
export async function craneBin(repoRoot: string): Promise<string> {
  if (process.env.VK_CRANE_BIN) return process.env.VK_CRANE_BIN;
  const out = await new Promise<string>((resolve, reject) => {
    const child = spawn('bash', [path.join(repoRoot, 'scripts', 'cranebin.sh')], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let text = '';
    child.stdout.on('data', (d: Buffer) => {
      text += d.toString();
    });
    child.on('close', (code) =>
      code === 0 ? resolve(text) : reject(new Error(`cranebin.sh exited ${code}`)),
    );
  });
  return path.join(out.trim().split('\n').pop() ?? '', 'crane');
}

const sec = (ms: number) => (Number.isFinite(ms) ? `${fmtN(ms / 1000, 1)} s` : '–');
const mbps = (r: Row) => fmtN(r.bytes / 1e6 / (r.ms / 1000), 0);
const rss = (r: Row) =>
  Number.isFinite(r.peakKiB)
    ? `${fmtN(r.peakKiB / 1024, 0)} MiB` +
      (Number.isFinite(r.startKiB) ? ` (${fmtN(r.startKiB / 1024, 0)})` : '')
    : '–';

/** Every row of one snapshot size, as measured. */
export function rowsTable(rows: readonly Row[]): string {
  return markdownTable(
    ['transfer', 'payload', 'wall', 'MB/s', 'peak RSS (idle)', 'CPU', 'CPU registry / simulator', 'what'],
    rows.map((r) => [
      r.what,
      `${fmtN(r.bytes / MiB, 0)} MiB`,
      sec(r.ms),
      mbps(r),
      rss(r),
      sec(r.cpuMs),
      `${sec(r.registryMs)} / ${sec(r.simMs)}`,
      r.note,
    ]),
  );
}

/** The (size, format, run) groups of the rows, in the order they were measured. */
function groups(rows: readonly Row[]): { size: string; format: Format; run: number; rows: Row[] }[] {
  const out: { size: string; format: Format; run: number; rows: Row[] }[] = [];
  for (const r of rows) {
    if (r.format === undefined) continue;
    let g = out.find((x) => x.size === r.size && x.format === r.format && x.run === r.run);
    if (!g) {
      g = { size: r.size, format: r.format, run: r.run, rows: [] };
      out.push(g);
    }
    g.rows.push(r);
  }
  return out;
}

/**
 * Ours against crane: the registry part (what crane does: fetch and verify every blob; upload
 * the same blobs), then the same with the work crane does not do (the tar, v2's zstd, hashing a
 * tar's files on push).
 */
export function summaryTable(rows: readonly Row[], runs: number): string {
  const lines: string[][] = [];
  /** Per snapshot, format and direction, over every run: wall seconds of ours and of crane. */
  const totals = new Map<
    string,
    { size: string; format: Format; direction: string; ours: number; crane: number; bytes: number; n: number }
  >();
  for (const g of groups(rows)) {
    const find = (kind: RowKind) => g.rows.find((r) => r.kind === kind);
    for (const [direction, oursKind, craneKind] of [
      ['push: upload', 'upload', 'crane-push'],
      ['pull: fetch + verify', 'fetch', 'crane-pull'],
      [`push: tar file ⇒ ${g.format === 'v2' ? 'zstd + ' : ''}hash + upload`, 'registry-push', 'crane-push'],
      [`pull: fetch + verify ⇒ ${g.format === 'v2' ? 'unzstd + ' : ''}tar`, 'registry-pull', 'crane-pull'],
    ] as const) {
      const ours = find(oursKind);
      const crane = find(craneKind);
      if (!ours || !crane) continue;
      const key = `${g.size}|${g.format}|${direction}`;
      const t = totals.get(key) ?? {
        size: g.size,
        format: g.format,
        direction,
        ours: 0,
        crane: 0,
        bytes: ours.bytes,
        n: 0,
      };
      t.ours += ours.ms;
      t.crane += crane.ms;
      t.n++;
      totals.set(key, t);
      lines.push([
        g.size,
        `${g.format}${runs > 1 ? ` #${g.run}` : ''}`,
        `${fmtN(ours.bytes / MiB, 0)} MiB`,
        direction,
        `${sec(ours.ms)} / ${sec(crane.ms)}`,
        `**${fmtN(ours.ms / crane.ms, 2)}**`,
        `${mbps(ours)} / ${mbps(crane)}`,
        `${rss(ours)} / ${rss(crane)}`,
      ]);
    }
  }
  // Several runs (ours and crane take turns at going first): the sum of each side's walls.
  if (runs > 1) {
    for (const t of totals.values()) {
      lines.push([
        t.size,
        `${t.format}, ${t.n} runs`,
        `${fmtN(t.bytes / MiB, 0)} MiB`,
        t.direction,
        `${sec(t.ours)} / ${sec(t.crane)} (sum)`,
        `**${fmtN(t.ours / t.crane, 2)}**`,
        '',
        '',
      ]);
    }
  }
  return markdownTable(
    [
      'snapshot',
      'format',
      'payload',
      'ours',
      'wall ours / crane',
      'ours ÷ crane (time)',
      'MB/s ours / crane',
      'peak RSS ours (idle) / crane',
    ],
    lines,
  );
}

/** The whole push and pull of ours (through cocoon), the registry part, and the simulator alone. */
export function cocoonTable(rows: readonly Row[], runs: number): string {
  const lines: string[][] = [];
  for (const g of groups(rows)) {
    const ms = (kind: RowKind) => sec(g.rows.find((r) => r.kind === kind)?.ms ?? Number.NaN);
    const alone = (kind: RowKind) =>
      sec(rows.find((r) => r.size === g.size && r.kind === kind && r.run === 1)?.ms ?? Number.NaN);
    lines.push([
      g.size,
      `${g.format}${runs > 1 ? ` #${g.run}` : ''}`,
      ms('push'),
      ms('registry-push'),
      alone('export'),
      ms('pull'),
      ms('registry-pull'),
      alone('import'),
    ]);
  }
  return markdownTable(
    [
      'snapshot',
      'format',
      'push, live export',
      'registry push',
      'simulator: export alone',
      'pull with import',
      'registry pull',
      'simulator: import alone',
    ],
    lines,
  );
}
