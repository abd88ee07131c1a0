// `vm clone` and `vm run` (cocoon-cli.md §2, §4): reserve the name in a `creating`
// placeholder, sleep the latency, then build the VM and start its stand-in.
import fs from 'node:fs';
import path from 'node:path';
import { bool, type CommandSpec, int, type Parsed, str } from '../cli.ts';
import type { Ctx, Verb } from '../ctx.ts';
import {
  findImage,
  ID_RE,
  imageDigestFor,
  isCloudImage,
  newId,
  nowIso,
  presentVm,
  readVmDb,
  type SnapshotRecord,
  type StaticNetwork,
  updateVmDb,
  VM_NAME_RE,
  type VmConfig,
  type VmRecord,
  withBothVmLocks,
} from '../db.ts';
import { CliError, ScriptedExit } from '../errors.ts';
import { registerImage } from '../images.ts';
import { readJson } from '../lock.ts';
import { BACKENDS, type BackendDir, backendDir, hypervisorOf, runDir, snapDataDir } from '../paths.ts';
import { acquireSnapshotUse, releaseSnapshotUse } from '../snapuse.ts';
import {
  buildNics,
  destroyVmFiles,
  finishBoot,
  GiB,
  knobNetwork,
  prepareRunDir,
  sourceMacs,
  startStandin,
  staticSeedsFrom,
  storageFor,
  writeOwner,
} from '../vmops.ts';

const cloneSpec: CommandSpec = {
  path: 'vm clone',
  usage: 'vm clone [flags] SNAPSHOT',
  flags: [
    { name: 'output', short: 'o', type: 'string' },
    { name: 'name', type: 'string' },
    { name: 'network', type: 'string' },
    { name: 'no-direct-io', type: 'bool' },
    { name: 'pull', type: 'bool' },
    { name: 'restore-mode', type: 'string' },
    { name: 'nics', type: 'int' },
    { name: 'cpu-weight', type: 'int' },
    { name: 'cpu-quota-us', type: 'int' },
    { name: 'cpu-period-us', type: 'int' },
    { name: 'from-dir', type: 'string' },
    // Older clone flags: accepted, ignored (the guest topology comes from the snapshot).
    { name: 'cpu', type: 'string', noop: true },
    { name: 'memory', type: 'string', noop: true },
    { name: 'storage', type: 'string', noop: true },
    { name: 'on-demand', type: 'bool', noop: true },
    { name: 'dns', type: 'string', noop: true },
  ],
  minArgs: 0,
  maxArgs: 1,
};

const runSpec: CommandSpec = {
  path: 'vm run',
  usage: 'vm run [flags] IMAGE',
  flags: [
    { name: 'output', short: 'o', type: 'string' },
    { name: 'name', type: 'string' },
    { name: 'cpu', type: 'int' },
    { name: 'cpu-weight', type: 'int' },
    { name: 'cpu-quota-us', type: 'int' },
    { name: 'cpu-period-us', type: 'int' },
    { name: 'memory', type: 'int' },
    { name: 'storage', type: 'int' },
    { name: 'network', type: 'string' },
    { name: 'windows', type: 'bool' },
    { name: 'fc', type: 'bool' },
    { name: 'no-direct-io', type: 'bool' },
  ],
  minArgs: 1,
  maxArgs: 1,
};

function outputFormat(p: Parsed): 'json' | 'table' {
  const o = str(p, 'output') ?? 'table';
  if (o !== 'json' && o !== 'table')
    throw new CliError(`unsupported output format "${o}" (want json or table)`);
  return o;
}

function checkName(name: string): void {
  if (!VM_NAME_RE.test(name)) {
    throw new CliError(`invalid vm name "${name}": must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`);
  }
}

function cpuPolicy(p: Parsed): Pick<VmConfig, 'cpu_weight' | 'cpu_quota_us' | 'cpu_period_us'> {
  const out: Pick<VmConfig, 'cpu_weight' | 'cpu_quota_us' | 'cpu_period_us'> = {};
  const w = int(p, 'cpu-weight');
  if (w !== undefined) {
    if (w < 1 || w > 10000) throw new CliError(`invalid --cpu-weight ${w}: must be between 1 and 10000`);
    out.cpu_weight = w;
  }
  const q = int(p, 'cpu-quota-us');
  if (q !== undefined) {
    if (q < 1000) throw new CliError(`invalid --cpu-quota-us ${q}: must be at least 1000`);
    out.cpu_quota_us = q;
  }
  const per = int(p, 'cpu-period-us');
  if (per !== undefined) {
    if (per < 1000 || per > 1_000_000)
      throw new CliError(`invalid --cpu-period-us ${per}: must be 1000..1000000`);
    out.cpu_period_us = per;
  }
  return out;
}

/** Reserves `name` in a `creating` placeholder (both DBs checked under both locks). */
function reserve(ctx: Ctx, dir: BackendDir, name: string, config: VmConfig): VmRecord {
  const root = ctx.root;
  return withBothVmLocks(root, () => {
    for (const d of BACKENDS) {
      if (readVmDb(root, d).names[name]) throw new CliError(`vm name "${name}" already exists`);
    }
    let id = newId();
    while (readVmDb(root, dir).vms[id]) id = newId();
    const now = nowIso();
    const vm: VmRecord = {
      id,
      hypervisor: hypervisorOf(dir),
      state: 'creating',
      config,
      pid: 0,
      created_at: now,
      updated_at: now,
    };
    updateVmDb(root, dir, (db) => {
      db.vms[id] = vm;
      db.names[name] = id;
    });
    writeOwner(root, id, ctx.io.owner.pid, ctx.io.owner.start);
    return vm;
  });
}

function dropRecord(ctx: Ctx, dir: BackendDir, id: string): void {
  updateVmDb(ctx.root, dir, (db) => {
    const vm = db.vms[id];
    if (!vm) return;
    delete db.vms[id];
    if (db.names[vm.config.name] === id) delete db.names[vm.config.name];
  });
}

function commit(ctx: Ctx, dir: BackendDir, vm: VmRecord): VmRecord {
  return updateVmDb(ctx.root, dir, (db) => {
    const cur = db.vms[vm.id];
    if (!cur) throw new CliError(`vm not found: ${vm.id}`);
    const next = { ...vm, created_at: cur.created_at, updated_at: nowIso() };
    db.vms[vm.id] = next;
    return next;
  });
}

function ensureImage(ctx: Ctx, image: string, digest: string | undefined, pull: boolean): void {
  if (!image) return;
  const present = (digest && findImage(ctx.root, digest)) || findImage(ctx.root, image);
  if (present) return;
  if (!pull) throw new CliError(`image "${image}" not resolved (clone without --pull)`);
  registerImage(ctx.root, image, digest || imageDigestFor(image, ctx.knobs.images?.digests));
}

interface SourceSnapshot {
  snap: SnapshotRecord;
  dataDir: string;
  named: boolean;
}

function fromDir(dir: string): SourceSnapshot {
  if (!path.isAbsolute(dir)) throw new CliError(`--from-dir ${dir}: must be an absolute path`);
  if (!fs.statSync(dir, { throwIfNoEntry: false })?.isDirectory()) {
    throw new CliError(`--from-dir ${dir}: no such directory`);
  }
  const env = readJson<{ version?: number; config?: Partial<SnapshotRecord> } | null>(
    path.join(dir, 'snapshot.json'),
    null,
  );
  if (!env?.config) throw new CliError(`--from-dir ${dir}: snapshot.json not found`);
  if (env.version !== 1) throw new CliError(`unsupported snapshot archive version ${env.version}`);
  const c = env.config;
  return {
    named: false,
    dataDir: dir,
    snap: {
      id: c.id && ID_RE.test(c.id) ? c.id : newId(),
      name: c.name ?? path.basename(dir),
      cpu: c.cpu ?? 2,
      memory: c.memory ?? 2 * GiB,
      storage: c.storage ?? 20 * GiB,
      image: c.image ?? '',
      image_digest: c.image_digest ?? '',
      image_type: c.image_type ?? '',
      image_blob_ids: c.image_blob_ids ?? {},
      hypervisor: c.hypervisor ?? 'cloud-hypervisor',
      nics: c.nics ?? 1,
      ...(c.network ? { network: c.network } : {}),
      ...(c.windows ? { windows: true } : {}),
      created_at: c.created_at ?? nowIso(),
    },
  };
}

function imageTypeOf(snap: SnapshotRecord, dataDir: string): string {
  if (snap.image_type) return snap.image_type;
  if (snap.image) return isCloudImage(snap.image) ? 'cloudimg' : 'oci';
  return fs.existsSync(path.join(dataDir, 'overlay.qcow2')) ? 'cloudimg' : 'oci';
}

function printVm(ctx: Ctx, format: 'json' | 'table', vm: VmRecord, pidZero = false): void {
  const shown = presentVm(ctx.root, vm);
  if (pidZero) shown.pid = 0;
  if (format === 'json') ctx.json(shown);
  else ctx.out(`${shown.id}\t${shown.config.name}\t${shown.state}`);
}

async function clone(ctx: Ctx, p: Parsed): Promise<number> {
  const format = outputFormat(p);
  const dirFlag = str(p, 'from-dir');
  const ref = p.args[0];
  if (dirFlag !== undefined && ref !== undefined) {
    throw new CliError('--from-dir and a snapshot argument are mutually exclusive');
  }
  if (dirFlag === undefined && ref === undefined)
    throw new CliError('requires a snapshot name or --from-dir');
  const restoreMode = str(p, 'restore-mode');
  if (restoreMode !== undefined && !['copy', 'ondemand', 'mmap'].includes(restoreMode)) {
    throw new CliError(`invalid --restore-mode "${restoreMode}": must be copy, ondemand or mmap`);
  }
  const nicsOverride = int(p, 'nics');
  if (nicsOverride !== undefined && nicsOverride < 1)
    throw new CliError(`invalid --nics ${nicsOverride}: must be >= 1`);
  const policy = cpuPolicy(p);
  const name = str(p, 'name');
  if (name !== undefined) checkName(name);

  const source: SourceSnapshot =
    dirFlag !== undefined
      ? fromDir(dirFlag)
      : (() => {
          const snap = acquireSnapshotUse(ctx.root, ref as string, 'clone');
          return { snap, dataDir: snapDataDir(ctx.root, snap.id), named: true };
        })();
  const { snap } = source;
  try {
    const dir = backendDir(snap.hypervisor);
    if (dir === 'firecracker' && restoreMode !== undefined) {
      throw new CliError('--restore-mode is not supported for firecracker snapshots');
    }
    if (dir === 'firecracker' && nicsOverride !== undefined) {
      throw new CliError('--nics is not supported for firecracker snapshots');
    }
    const imageType = imageTypeOf(snap, source.dataDir);
    const id0 = newId();
    const vmName = name ?? `cocoon-clone-${id0.slice(0, 8).toLowerCase()}`;
    const network = str(p, 'network') ?? snap.network;
    const config: VmConfig = {
      name: vmName,
      cpu: snap.cpu,
      memory: snap.memory,
      storage: snap.storage,
      image: snap.image,
      image_digest: snap.image_digest,
      image_type: imageType,
      ...(network ? { network } : {}),
      ...(snap.windows ? { windows: true } : {}),
      ...policy,
      ...(restoreMode ? { restore_mode: restoreMode } : {}),
      ...(bool(p, 'no-direct-io') ? { no_direct_io: true } : {}),
      snapshot: snap.name,
    };
    const placeholder = reserve(ctx, dir, vmName, { name: vmName, cpu: snap.cpu, memory: snap.memory });
    let vm: VmRecord = { ...placeholder, config };
    try {
      await ctx.latency(vmName);
      await ctx.faults('start', p, [vmName, snap.name]);
      ensureImage(ctx, snap.image, snap.image_digest, bool(p, 'pull') || dirFlag !== undefined);
      const count = nicsOverride ?? snap.nics ?? 1;
      const seedsFromSnap = staticSeedsFrom(source.dataDir);
      const knobSeed = knobNetwork(ctx.knobs, network);
      const staticSeeds: (StaticNetwork | undefined)[] = [];
      for (let i = 0; i < count; i++) staticSeeds.push(knobSeed ?? seedsFromSnap[i]);
      vm.network_configs = buildNics(ctx.root, vm.id, dir, snap.cpu, { count, staticSeeds });
      vm.storage_configs = storageFor(ctx.root, dir, vm, imageType);
      vm.socket_path = path.join(runDir(ctx.root, dir, vm.id), 'api.sock');
      vm.vsock_socket = path.join(runDir(ctx.root, dir, vm.id), 'vsock.uds');
      vm.first_booted = true;
      prepareRunDir(ctx.root, dir, vm, imageType, true, source.dataDir);
      const pid = startStandin(ctx.root, dir, vm, {
        knobs: ctx.knobs,
        leasesPath: ctx.leasesPath,
        clone: true,
        hotNic: nicsOverride !== undefined,
        imageType,
        sourceMacs: sourceMacs(source.dataDir, snap.id, count),
      });
      if (!pid) throw new CliError(`start vm ${vm.id}: failed to launch ${vm.hypervisor}`);
      const now = nowIso();
      vm = commit(ctx, dir, { ...vm, state: 'running', pid, started_at: now });
    } catch (e) {
      // A failed clone rolls its record back (cocoon-cli.md §4).
      dropRecord(ctx, dir, vm.id);
      destroyVmFiles(ctx.root, dir, vm.id, 0);
      throw e;
    }
    fs.rmSync(path.join(ctx.root, 'sim', 'owners', vm.id), { force: true });
    finishBoot(ctx.root, ctx.leasesPath, vm.id, ctx.knobs);
    // cocoon-cli.md §2: the printed clone record may carry pid 0; the provider must not rely on it.
    printVm(ctx, format, vm, ctx.knobs.quirks?.clonePidZero === true);
    return 0;
  } finally {
    if (source.named) releaseSnapshotUse(ctx.root, snap.id, 'clone');
  }
}

async function run(ctx: Ctx, p: Parsed): Promise<number> {
  const format = outputFormat(p);
  const imageRef = p.args[0] as string;
  const windows = bool(p, 'windows');
  const fc = bool(p, 'fc');
  const policy = cpuPolicy(p);
  const name = str(p, 'name');
  if (name !== undefined) checkName(name);
  if (fc && windows) throw new CliError('firecracker does not support windows guests (--fc with --windows)');
  const cpu = int(p, 'cpu') ?? 2;
  if (cpu < 1 || cpu > 256) throw new CliError(`invalid --cpu ${cpu}: must be between 1 and 256`);
  const memory = int(p, 'memory') ?? GiB;
  if (memory < 128 * 1024 * 1024)
    throw new CliError(`invalid --memory ${memory}: must be at least 134217728`);
  const storage = int(p, 'storage') ?? (windows ? 40 : 10) * GiB;
  if (storage < 1024 * 1024) throw new CliError(`invalid --storage ${storage}: must be at least 1048576`);
  const img = findImage(ctx.root, imageRef);
  if (!img) throw new CliError(`image "${imageRef}" not resolved`);
  if (windows && img.type !== 'cloudimg')
    throw new CliError(`--windows requires a cloud image, "${imageRef}" is ${img.type}`);
  if (fc && img.type !== 'oci')
    throw new CliError(`firecracker requires an OCI image, "${imageRef}" is ${img.type}`);
  const dir: BackendDir = fc ? 'firecracker' : 'cloudhypervisor';
  const network = str(p, 'network');
  const id0 = newId();
  const vmName = name ?? `cocoon-${id0.slice(0, 8).toLowerCase()}`;
  const config: VmConfig = {
    name: vmName,
    cpu,
    memory,
    storage,
    image: img.name,
    image_digest: img.id,
    image_type: img.type,
    ...(network ? { network } : {}),
    ...(windows ? { windows: true } : {}),
    ...policy,
    ...(bool(p, 'no-direct-io') ? { no_direct_io: true } : {}),
  };
  const placeholder = reserve(ctx, dir, vmName, { name: vmName, cpu, memory });
  let vm: VmRecord = { ...placeholder, config };
  try {
    await ctx.latency();
    const seed = knobNetwork(ctx.knobs, network);
    vm.network_configs = buildNics(ctx.root, vm.id, dir, cpu, { count: 1, staticSeeds: [seed] });
    vm.storage_configs = storageFor(ctx.root, dir, vm, img.type);
    vm.socket_path = path.join(runDir(ctx.root, dir, vm.id), 'api.sock');
    vm.vsock_socket = path.join(runDir(ctx.root, dir, vm.id), 'vsock.uds');
    vm.first_booted = false;
    prepareRunDir(ctx.root, dir, vm, img.type, false);
    vm = commit(ctx, dir, { ...vm, state: 'created' });
  } catch (e) {
    dropRecord(ctx, dir, vm.id);
    destroyVmFiles(ctx.root, dir, vm.id, 0);
    throw e;
  }
  fs.rmSync(path.join(ctx.root, 'sim', 'owners', vm.id), { force: true });
  try {
    await ctx.faults('start', p, [vmName]);
    const pid = startStandin(ctx.root, dir, vm, {
      knobs: ctx.knobs,
      leasesPath: ctx.leasesPath,
      clone: false,
      hotNic: false,
      imageType: img.type,
    });
    if (!pid) throw new CliError(`start vm ${vm.id}: failed to launch ${vm.hypervisor}`);
    vm = commit(ctx, dir, { ...vm, state: 'running', pid, first_booted: true, started_at: nowIso() });
  } catch (e) {
    // A start failure leaves the record in state `error`, holding the name (cocoon-cli.md §2).
    updateVmDb(ctx.root, dir, (db) => {
      const cur = db.vms[vm.id];
      if (cur) db.vms[vm.id] = { ...cur, state: 'error', pid: 0, updated_at: nowIso() };
    });
    if (e instanceof ScriptedExit || e instanceof CliError) throw e;
    throw new CliError(`start vm ${vm.id}: ${(e as Error).message}`);
  }
  finishBoot(ctx.root, ctx.leasesPath, vm.id, ctx.knobs);
  printVm(ctx, format, vm);
  return 0;
}

export const verbs: Record<string, Verb> = {
  clone: { spec: cloneSpec, reserving: true, run: clone },
  run: { spec: runSpec, reserving: true, run },
};
