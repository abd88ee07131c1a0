// `vm status --event --format json [-n secs]` (cocoon-cli.md §3.3, §8.6): ADDED for every VM
// on the first tick, MODIFIED when (id, name, reconciled state, cpu, memory, static IPs,
// image) changes, DELETED with the last known record. Ticks on a change of either backend's
// vms.json (200 ms debounce) and on an interval ticker. Without --event: one snapshot.
import fs from 'node:fs';
import path from 'node:path';
import { bool, type CommandSpec, int, type Parsed, str } from '../cli.ts';
import type { Ctx, Verb } from '../ctx.ts';
import { allVms, presentVm, type VmRecord } from '../db.ts';
import { CliError } from '../errors.ts';
import { BACKENDS, vmDbFile } from '../paths.ts';

const spec: CommandSpec = {
  path: 'vm status',
  usage: 'vm status [--event] [--format json] [-n SECONDS] [VM...]',
  flags: [
    { name: 'event', type: 'bool' },
    { name: 'format', type: 'string' },
    { name: 'interval', short: 'n', type: 'int' },
  ],
  minArgs: 0,
  maxArgs: Infinity,
};

function tuple(vm: VmRecord): string {
  const ips = (vm.network_configs ?? []).map((n) => n.network?.ip ?? '').join(',');
  return JSON.stringify([
    vm.id,
    vm.config.name,
    vm.state,
    vm.config.cpu,
    vm.config.memory,
    ips,
    vm.config.image,
  ]);
}

function snapshot(ctx: Ctx, filter: Set<string>): Map<string, VmRecord> {
  const out = new Map<string, VmRecord>();
  for (const { vm } of allVms(ctx.root)) {
    if (filter.size > 0 && !filter.has(vm.id) && !filter.has(vm.config.name)) continue;
    out.set(vm.id, presentVm(ctx.root, vm));
  }
  return out;
}

async function status(ctx: Ctx, p: Parsed): Promise<number> {
  const format = str(p, 'format') ?? 'table';
  if (format !== 'json' && format !== 'table')
    throw new CliError(`unsupported format "${format}" (want json or table)`);
  const seconds = int(p, 'interval') ?? 5;
  if (seconds < 1) throw new CliError(`invalid -n ${seconds}: must be at least 1`);
  const filter = new Set(p.args);
  if (!bool(p, 'event')) {
    const vms = [...snapshot(ctx, filter).values()];
    if (format === 'json') ctx.json(vms);
    else for (const v of vms) ctx.out(`${v.id}\t${v.config.name}\t${v.state}`);
    return 0;
  }
  const emit = (event: string, vm: VmRecord) => {
    const line =
      format === 'json'
        ? `${JSON.stringify({ event, vm })}\n`
        : `${event}\t${vm.id}\t${vm.config.name}\t${vm.state}\n`;
    ctx.io.stdout.write(line);
  };
  const known = new Map<string, { key: string; vm: VmRecord }>();
  const tick = () => {
    let now: Map<string, VmRecord>;
    try {
      now = snapshot(ctx, filter);
    } catch {
      return; // unreadable DB (should not happen with atomic writes): try again next tick
    }
    for (const [id, vm] of now) {
      const key = tuple(vm);
      const prev = known.get(id);
      if (!prev) emit('ADDED', vm);
      else if (prev.key !== key) emit('MODIFIED', vm);
      known.set(id, { key, vm });
    }
    for (const [id, prev] of known) {
      if (!now.has(id)) {
        emit('DELETED', prev.vm);
        known.delete(id);
      }
    }
  };
  const cur = ctx.io;
  const watchers: fs.FSWatcher[] = [];
  let timer: NodeJS.Timeout | undefined;
  let ticker: NodeJS.Timeout | undefined;
  // A server request must release what it set up when it ends (a process just exits).
  cur.defer(() => {
    for (const w of watchers) w.close();
    clearTimeout(timer);
    clearInterval(ticker);
  });
  const stop = () => {
    ctx.finish(0);
    cur.exit(0);
  };
  cur.onSignal('SIGTERM', stop);
  cur.onSignal('SIGINT', stop);
  cur.stdout.on('error', stop);
  tick();
  const poke = () => {
    if (timer) return;
    timer = setTimeout(() => {
      timer = undefined;
      tick();
    }, 200);
  };
  for (const dir of BACKENDS) {
    const dbDir = path.dirname(vmDbFile(ctx.root, dir));
    fs.mkdirSync(dbDir, { recursive: true });
    watchers.push(
      fs.watch(dbDir, (_event, file) => {
        if (!file || file === 'vms.json') poke();
      }),
    );
  }
  ticker = setInterval(tick, seconds * 1000);
  await new Promise<never>(() => {});
  return 0;
}

export const verbs: Record<string, Verb> = { status: { spec, run: status } };
