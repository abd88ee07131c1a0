// The hidden `__sim <action>` verb (cocoon-cli.md §8.5): state manipulation for tests.
// Real cocoon has no such verb; these invocations are not written to calls.jsonl.
import fs from 'node:fs';
import path from 'node:path';
import { bool, type CommandSpec, parseArgs, str } from '../cli.ts';
import {
  mustFindSnapshot,
  mustFindVm,
  newId,
  nowIso,
  readVmDb,
  updateVmDb,
  VM_NAME_RE,
  type VmRecord,
  type VmState,
  withBothVmLocks,
} from '../db.ts';
import { CliError } from '../errors.ts';
import { readGuest } from '../guest.ts';
import { io, serverInfo } from '../io.ts';
import { loadKnobs } from '../knobs.ts';
import { formatExpiry, grantIn, LEASE_MAC, leaseOptions, releaseIn, updateLeases } from '../leases.ts';
import { BACKENDS, leasesFile, runDir, simDir } from '../paths.ts';
import { killTracked, killTrackedAll, listTracked, trackedAlive } from '../pids.ts';
import { isAlive, killGroup } from '../proc.ts';
import { addUse } from '../snapuse.ts';
import { spawnDetached } from '../spawn.ts';
import { destroyVmFiles, writeOwner } from '../vmops.ts';
import { reservePending } from './snapshot.ts';

const USAGE = `Usage: cocoon __sim <action> ...
  crash <vm>                         kill the VM's stand-in (=> stopped (stale))
  set-state <vm> <stopped|error|created>  write the state directly (kills the stand-in)
  delete-behind-back <vm>            remove record and dirs without rm
  stale-create <name> [--busy] [--fc]  leave a creating placeholder (busy: held by a live process)
  pending-snapshot <name> [--busy]   leave a pending snapshot record blocking the name
  hold-snapshot <snapshot> [--kind clone|restore|export]  mark a snapshot in use by a live process
  expire-lease <mac> [--remove]      expire (or drop) the MAC's lease in the lease file
  release-lease <mac>                drop the MAC's lease (what cocoon-net's DELETE does)
  grant-lease <mac> [--ip <ip>]      write a lease for any MAC
  guest <vm>                         print the simulated guest state
  disk-write <vm> [--] <text>        write <text> + NUL at offset 0 of the VM's COW disk
  disk-read <vm>                     print the text at offset 0 of the COW disk (up to the NUL)
  kill-all                           kill every process the simulator started in this root
  server                             the serving simulator server ({"server":null} in process mode)
`;

function spec(pathName: string, flags: CommandSpec['flags'], minArgs: number, maxArgs: number): CommandSpec {
  return { path: `__sim ${pathName}`, usage: `__sim ${pathName}`, flags, minArgs, maxArgs };
}

function holder(root: string, label: string): { pid: number; start: number } {
  const pid = spawnDetached(
    root,
    {
      argv0: `cocoon-${label}`,
      cmd: 'sleep',
      args: ['infinity'],
      log: path.join(simDir(root), 'holders.log'),
    },
    'holder',
  );
  if (!pid) throw new CliError('could not start a holder process');
  const start = Number(fs.readFileSync(`/proc/${pid}/stat`, 'latin1').split(') ')[1]?.split(' ')[19]);
  return { pid, start };
}

/** Longest text `disk-read` returns (and `disk-write` accepts, with its NUL). */
const MARKER_MAX = 4096;

/** The VM's COW disk: overlay.qcow2 (cloud image) or cow.raw (OCI) in its run dir. */
function cowDisk(root: string, ref: string): string {
  const { dir, vm } = mustFindVm(root, ref);
  const rd = runDir(root, dir, vm.id);
  for (const f of ['overlay.qcow2', 'cow.raw']) {
    const file = path.join(rd, f);
    if (fs.statSync(file, { throwIfNoEntry: false })?.isFile()) return file;
  }
  throw new CliError(`vm ${vm.id} has no COW disk (state: ${vm.state})`);
}

function print(value: unknown): void {
  io().stdout.write(`${JSON.stringify(value)}\n`);
}

export async function runSimAction(root: string, argv: string[], env: NodeJS.ProcessEnv): Promise<number> {
  const [action, ...rest] = argv;
  const leases = leasesFile(root, env);
  // Only the lease actions read the knobs: kill-all and friends must work even with a broken file.
  const leaseOpts = async () => leaseOptions(await loadKnobs(root));
  switch (action) {
    case undefined:
    case 'help':
    case '--help':
      io().stdout.write(USAGE);
      return 0;
    case 'crash': {
      const p = parseArgs(spec('crash', [], 1, 1), rest);
      const { vm } = mustFindVm(root, p.args[0] as string);
      if (!trackedAlive(root, vm.pid)) throw new CliError(`vm ${vm.id} has no live process`);
      killTracked(root, vm.pid);
      print({ id: vm.id, pid: vm.pid, killed: true });
      return 0;
    }
    case 'set-state': {
      const p = parseArgs(spec('set-state', [], 2, 2), rest);
      const state = p.args[1] as string;
      if (!['stopped', 'error', 'created'].includes(state)) {
        throw new CliError(`set-state: state must be stopped, error or created, not "${state}"`);
      }
      const { dir, vm } = mustFindVm(root, p.args[0] as string);
      killTracked(root, vm.pid);
      updateVmDb(root, dir, (db) => {
        const cur = db.vms[vm.id];
        if (cur)
          db.vms[vm.id] = {
            ...cur,
            state: state as VmState,
            pid: 0,
            updated_at: nowIso(),
            stopped_at: nowIso(),
          };
      });
      print({ id: vm.id, state });
      return 0;
    }
    case 'delete-behind-back': {
      const p = parseArgs(spec('delete-behind-back', [], 1, 1), rest);
      const { dir, vm } = mustFindVm(root, p.args[0] as string);
      updateVmDb(root, dir, (db) => {
        delete db.vms[vm.id];
        if (db.names[vm.config.name] === vm.id) delete db.names[vm.config.name];
      });
      destroyVmFiles(root, dir, vm.id, vm.pid);
      print({ id: vm.id, deleted: true });
      return 0;
    }
    case 'stale-create': {
      const p = parseArgs(
        spec(
          'stale-create',
          [
            { name: 'busy', type: 'bool' },
            { name: 'fc', type: 'bool' },
          ],
          1,
          1,
        ),
        rest,
      );
      const name = p.args[0] as string;
      if (!VM_NAME_RE.test(name)) throw new CliError(`invalid vm name "${name}"`);
      const dir = bool(p, 'fc') ? 'firecracker' : 'cloudhypervisor';
      const vm = withBothVmLocks(root, (): VmRecord => {
        for (const d of BACKENDS)
          if (readVmDb(root, d).names[name]) throw new CliError(`vm name "${name}" already exists`);
        const now = nowIso();
        const rec: VmRecord = {
          id: newId(),
          hypervisor: dir === 'firecracker' ? 'firecracker' : 'cloud-hypervisor',
          state: 'creating',
          config: { name },
          pid: 0,
          created_at: now,
          updated_at: now,
        };
        updateVmDb(root, dir, (db) => {
          db.vms[rec.id] = rec;
          db.names[name] = rec.id;
        });
        return rec;
      });
      let holderPid = 0;
      if (bool(p, 'busy')) {
        const h = holder(root, 'create-holder');
        writeOwner(root, vm.id, h.pid, h.start);
        holderPid = h.pid;
      }
      print({ id: vm.id, name, ...(holderPid ? { holderPid } : {}) });
      return 0;
    }
    case 'pending-snapshot': {
      const p = parseArgs(spec('pending-snapshot', [{ name: 'busy', type: 'bool' }], 1, 1), rest);
      const name = p.args[0] as string;
      const h = bool(p, 'busy') ? holder(root, 'snapshot-holder') : undefined;
      const rec = reservePending(
        root,
        {
          id: '',
          name,
          cpu: 2,
          memory: 2 * 1024 ** 3,
          storage: 20 * 1024 ** 3,
          image: '',
          image_digest: '',
          image_type: '',
          image_blob_ids: {},
          hypervisor: 'cloud-hypervisor',
          nics: 1,
          created_at: nowIso(),
        },
        h?.pid ?? 0,
        h?.start ?? 0,
      );
      print({ id: rec.id, name, ...(h ? { holderPid: h.pid } : {}) });
      return 0;
    }
    case 'hold-snapshot': {
      const p = parseArgs(spec('hold-snapshot', [{ name: 'kind', type: 'string' }], 1, 1), rest);
      const kind = str(p, 'kind') ?? 'clone';
      if (!['clone', 'restore', 'export'].includes(kind))
        throw new CliError(`hold-snapshot: unknown kind "${kind}"`);
      const snap = mustFindSnapshot(root, p.args[0] as string);
      const h = holder(root, `${kind}-holder`);
      addUse(root, snap.id, kind, h.pid, h.start);
      print({ id: snap.id, kind, holderPid: h.pid });
      return 0;
    }
    case 'expire-lease': {
      const p = parseArgs(spec('expire-lease', [{ name: 'remove', type: 'bool' }], 1, 1), rest);
      const mac = (p.args[0] as string).toLowerCase();
      const opts = await leaseOpts();
      const n = updateLeases(leases, opts, (list, now) => {
        if (bool(p, 'remove')) return releaseIn(list, mac);
        let hits = 0;
        for (const l of list) {
          if (l.mac.toLowerCase() === mac) {
            l.expiry = formatExpiry(now - 1000, opts.offset);
            hits += 1;
          }
        }
        return hits;
      });
      if (n === 0) throw new CliError(`no lease for ${mac}`);
      print({ mac, expired: n });
      return 0;
    }
    case 'release-lease': {
      const p = parseArgs(spec('release-lease', [], 1, 1), rest);
      const mac = (p.args[0] as string).toLowerCase();
      const n = updateLeases(leases, await leaseOpts(), (list) => releaseIn(list, mac));
      print({ mac, released: n });
      return 0;
    }
    case 'grant-lease': {
      const p = parseArgs(spec('grant-lease', [{ name: 'ip', type: 'string' }], 1, 1), rest);
      const mac = (p.args[0] as string).toLowerCase();
      if (!LEASE_MAC.test(mac)) throw new CliError(`invalid MAC "${mac}"`);
      const want = str(p, 'ip');
      const opts = await leaseOpts();
      const ip = updateLeases(leases, opts, (list, now) => {
        if (!want) return grantIn(list, mac, opts, now);
        releaseIn(list, mac);
        list.push({ mac, ip: want, expiry: formatExpiry(now + opts.ttlMs, opts.offset) });
        return want;
      });
      print({ mac, ip });
      return 0;
    }
    case 'guest': {
      const p = parseArgs(spec('guest', [], 1, 1), rest);
      const { vm } = mustFindVm(root, p.args[0] as string);
      print(readGuest(root, vm.id) ?? null);
      return 0;
    }
    case 'disk-write': {
      const p = parseArgs(spec('disk-write', [], 2, 2), rest);
      const file = cowDisk(root, p.args[0] as string);
      const data = Buffer.from(`${p.args[1] as string}\0`, 'utf8');
      if (data.length > MARKER_MAX)
        throw new CliError(`disk-write: text longer than ${MARKER_MAX - 1} bytes`);
      const fd = fs.openSync(file, 'r+');
      try {
        fs.writeSync(fd, data, 0, data.length, 0);
      } finally {
        fs.closeSync(fd);
      }
      return 0;
    }
    case 'disk-read': {
      const p = parseArgs(spec('disk-read', [], 1, 1), rest);
      const file = cowDisk(root, p.args[0] as string);
      const buf = Buffer.alloc(MARKER_MAX);
      const fd = fs.openSync(file, 'r');
      let n: number;
      try {
        n = fs.readSync(fd, buf, 0, MARKER_MAX, 0);
      } finally {
        fs.closeSync(fd);
      }
      const nul = buf.subarray(0, n).indexOf(0);
      io().stdout.write(`${buf.subarray(0, nul < 0 ? n : nul).toString('utf8')}\n`);
      return 0;
    }
    case 'server': {
      parseArgs(spec('server', [], 0, 0), rest);
      print({ server: io().server ? (serverInfo.stats?.() ?? null) : null });
      return 0;
    }
    case 'kill-all': {
      parseArgs(spec('kill-all', [], 0, 0), rest);
      const procs = listTracked(root);
      const others = procs.filter((x) => x.kind !== 'reaper');
      const killed = others.filter((t) => isAlive(t.pid, t.start)).length;
      killTrackedAll(
        root,
        others.map((t) => t.pid),
      );
      // Give the reaper a moment to reap, then stop it (its TERM trap kills leftovers).
      await new Promise((r) => setTimeout(r, 300));
      for (const t of procs.filter((x) => x.kind === 'reaper')) {
        if (isAlive(t.pid, t.start)) killGroup(t.pid, 'SIGTERM');
        for (let i = 0; i < 20 && isAlive(t.pid, t.start); i++) await new Promise((r) => setTimeout(r, 50));
        killTracked(root, t.pid);
      }
      print({ killed });
      return 0;
    }
    default:
      throw new CliError(`unknown __sim action "${action}"\n${USAGE}`);
  }
}
