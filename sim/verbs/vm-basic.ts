// vm rm / start / net / logs / reconcile-stale-create (inspect and list live in vm-read.ts).
import fs from 'node:fs';
import { bool, type CommandSpec, int, type Parsed, str } from '../cli.ts';
import type { Ctx, Verb } from '../ctx.ts';
import { findVm, mustFindVm, nowIso, reconciledState, updateVmDb, type VmRecord } from '../db.ts';
import { CliError, ScriptedExit } from '../errors.ts';
import { dhcpSync, type GuestNic, readGuest, updateGuest } from '../guest.ts';
import { consoleLogFile } from '../paths.ts';
import { killTracked } from '../pids.ts';
import { buildNics, destroyVmFiles, finishBoot, knobNetwork, ownerAlive, startStandin } from '../vmops.ts';

const spec = (path: string, usage: string, flags: CommandSpec['flags'], minArgs: number, maxArgs: number) =>
  ({ path, usage, flags, minArgs, maxArgs }) satisfies CommandSpec;

/** Removes a VM like cocoon: kill the VMM's process group, then remove the record and its dirs. */
export function removeVm(ctx: Ctx, ref: string, force: boolean): string {
  const { dir, vm } = mustFindVm(ctx.root, ref);
  const state = reconciledState(ctx.root, vm);
  if (state === 'creating' && ownerAlive(ctx.root, vm.id)) {
    throw new CliError(`vm ${vm.id} is being created (busy); retry later`);
  }
  if (state === 'running' && !force) {
    throw new CliError(`vm ${vm.id} is running; stop it first or use --force`);
  }
  killTracked(ctx.root, vm.pid);
  const removed = updateVmDb(ctx.root, dir, (db) => {
    const cur = db.vms[vm.id];
    if (!cur) throw new CliError(`vm not found: ${ref}`);
    delete db.vms[vm.id];
    if (db.names[cur.config.name] === vm.id) delete db.names[cur.config.name];
    return cur;
  });
  destroyVmFiles(ctx.root, dir, removed.id, removed.pid);
  return removed.id;
}

async function rm(ctx: Ctx, p: Parsed): Promise<number> {
  const force = bool(p, 'force');
  let failed: CliError | undefined;
  for (const ref of p.args) {
    try {
      ctx.out(removeVm(ctx, ref, force));
    } catch (e) {
      if (!(e instanceof CliError)) throw e;
      failed = e;
      ctx.err(`Error: ${e.message}`);
    }
  }
  if (failed) {
    // Already printed per reference; exit like cocoon with the last error.
    throw new ScriptedExit(1, '', '');
  }
  return 0;
}

async function start(ctx: Ctx, p: Parsed): Promise<number> {
  for (const ref of p.args) {
    const { dir, vm } = mustFindVm(ctx.root, ref);
    const state = reconciledState(ctx.root, vm);
    if (state === 'running') {
      ctx.out(vm.id);
      continue;
    }
    if (state === 'creating') throw new CliError(`vm ${vm.id} is still being created`);
    try {
      await ctx.faults('start', p, [vm.config.name]);
      killTracked(ctx.root, vm.pid);
      const previous = readGuest(ctx.root, vm.id);
      const pid = startStandin(ctx.root, dir, vm, {
        knobs: ctx.knobs,
        leasesPath: ctx.leasesPath,
        clone: false,
        hotNic: false,
        imageType: vm.config.image_type ?? 'oci',
        ...(previous ? { previous } : {}),
      });
      if (!pid) throw new CliError(`start vm ${vm.id}: failed to launch ${vm.hypervisor}`);
      updateVmDb(ctx.root, dir, (db) => {
        const cur = db.vms[vm.id];
        if (!cur) throw new CliError(`vm not found: ${ref}`);
        db.vms[vm.id] = { ...cur, state: 'running', pid, started_at: nowIso(), updated_at: nowIso() };
      });
    } catch (e) {
      updateVmDb(ctx.root, dir, (db) => {
        const cur = db.vms[vm.id];
        if (cur) db.vms[vm.id] = { ...cur, state: 'error', pid: 0, updated_at: nowIso() };
      });
      throw e;
    }
    finishBoot(ctx.root, ctx.leasesPath, vm.id, ctx.knobs);
    ctx.out(vm.id);
  }
  return 0;
}

async function net(ctx: Ctx, p: Parsed): Promise<number> {
  const n = int(p, 'nics');
  if (n === undefined) throw new CliError('required flag(s) "nics" not set');
  if (n < 0 || n > 16) throw new CliError(`invalid --nics ${n}: must be between 0 and 16`);
  const { dir, vm } = mustFindVm(ctx.root, p.args[0] as string);
  if (dir === 'firecracker') throw new CliError('vm net: NIC hot-plug is not supported by firecracker');
  const state = reconciledState(ctx.root, vm);
  if (state !== 'running') throw new CliError(`vm ${vm.id} is not running (state: ${state})`);
  const current = vm.network_configs ?? [];
  let next = current.slice(0, n);
  if (n > current.length) {
    const seed = knobNetwork(ctx.knobs, vm.config.network);
    const added = buildNics(
      ctx.root,
      vm.id,
      dir,
      vm.config.cpu ?? 2,
      { count: n - current.length, staticSeeds: Array(n).fill(seed) },
      current.length,
    );
    next = [...current, ...added];
  }
  updateVmDb(ctx.root, dir, (db) => {
    const cur = db.vms[vm.id];
    if (!cur) throw new CliError(`vm not found: ${vm.id}`);
    db.vms[vm.id] = { ...cur, network_configs: next, updated_at: nowIso() };
  });
  updateGuest(ctx.root, vm.id, (g) => {
    const nics: GuestNic[] = next.map((c, i) => {
      const old = g.nics[i];
      if (old && old.mac === c.mac) return old;
      const nic: GuestNic = { mac: c.mac, guestMac: c.mac, dhcp: !c.network };
      if (c.network) {
        nic.staticIp = c.network.ip;
        nic.prefix = c.network.prefix;
        nic.gateway = c.network.gateway;
      }
      return nic;
    });
    g.nics = nics;
    // A hot-added NIC comes up by itself (no PnP rebind) and asks for a lease.
    if (n > current.length) {
      g.needsPnp = false;
      g.dhcpDone = false;
    }
  });
  dhcpSync(ctx.root, ctx.leasesPath, vm.id, ctx.knobs);
  ctx.out(vm.id);
  return 0;
}

async function logs(ctx: Ctx, p: Parsed): Promise<number> {
  const tail = int(p, 'tail') ?? -1;
  const { dir, vm } = mustFindVm(ctx.root, p.args[0] as string);
  let text = '';
  try {
    text = fs.readFileSync(consoleLogFile(ctx.root, dir, vm.id), 'utf8');
  } catch {
    // no console output yet
  }
  if (tail >= 0) {
    const lines = text.split('\n');
    if (lines[lines.length - 1] === '') lines.pop();
    text = tail === 0 ? '' : `${lines.slice(-tail).join('\n')}${lines.length > 0 ? '\n' : ''}`;
  }
  ctx.io.stdout.write(text);
  return 0;
}

async function reconcileStaleCreate(ctx: Ctx, p: Parsed): Promise<number> {
  const o = str(p, 'output') ?? 'json';
  if (o !== 'json') throw new CliError(`unsupported output format "${o}" (want json)`);
  const ref = p.args[0] as string;
  const hit = findVm(ctx.root, ref);
  if (!hit) {
    ctx.out(JSON.stringify({ outcome: 'not-found' }));
    return 0;
  }
  const outcome = updateVmDb(ctx.root, hit.dir, (db): { vm?: VmRecord; outcome: string } => {
    const vm = db.vms[hit.vm.id];
    if (!vm) return { outcome: 'not-found' };
    if (vm.state !== 'creating') return { vm, outcome: 'not-creating' };
    if (ownerAlive(ctx.root, vm.id)) return { vm, outcome: 'busy' };
    delete db.vms[vm.id];
    if (db.names[vm.config.name] === vm.id) delete db.names[vm.config.name];
    return { vm, outcome: 'collected' };
  });
  if (outcome.outcome === 'collected' && outcome.vm) destroyVmFiles(ctx.root, hit.dir, outcome.vm.id, 0);
  ctx.out(
    JSON.stringify(
      outcome.outcome === 'not-found'
        ? { outcome: 'not-found' }
        : { id: hit.vm.id, outcome: outcome.outcome },
    ),
  );
  return 0;
}

export const verbs: Record<string, Verb> = {
  rm: {
    spec: spec(
      'vm rm',
      'vm rm [--force] VM [VM...]',
      [{ name: 'force', short: 'f', type: 'bool' }],
      1,
      Infinity,
    ),
    run: rm,
  },
  start: { spec: spec('vm start', 'vm start VM [VM...]', [], 1, Infinity), run: start },
  net: { spec: spec('vm net', 'vm net --nics N VM', [{ name: 'nics', type: 'int' }], 1, 1), run: net },
  logs: {
    spec: spec('vm logs', 'vm logs [--tail N] VM', [{ name: 'tail', short: 'n', type: 'int' }], 1, 1),
    run: logs,
  },
  'reconcile-stale-create': {
    spec: spec(
      'vm reconcile-stale-create',
      'vm reconcile-stale-create VM -o json',
      [{ name: 'output', short: 'o', type: 'string' }],
      1,
      1,
    ),
    run: reconcileStaleCreate,
  },
};
