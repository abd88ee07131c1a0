// snapshot save / inspect / rm / list / import / export (cocoon-cli.md §2, §3.2, §3.4, §8.7).
// save and import first reserve the name in a *pending* record (hidden from inspect and list,
// but blocking the name: "already in use by <ID>"), then do the work, then commit.
import fs from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { type CommandSpec, type Parsed, str } from '../cli.ts';
import type { Ctx, Verb } from '../ctx.ts';
import {
  findSnapshotIn,
  ID_RE,
  mustFindSnapshot,
  mustFindVm,
  newId,
  nowIso,
  readSnapDb,
  reconciledState,
  SNAPSHOT_NAME_RE,
  type SnapshotRecord,
  updateSnapDb,
} from '../db.ts';
import {
  copySparse,
  decodeSparseMap,
  encodeSparseMap,
  planExport,
  readSegments,
  type Segment,
  SegmentWriter,
} from '../disk.ts';
import { CliError } from '../errors.ts';
import { io } from '../io.ts';
import { ownerFile, runDir, snapDataDir } from '../paths.ts';
import { activeUse, addUse, dropUses, releaseSnapshotUse } from '../snapuse.ts';
import { GiB, ownerAlive, writeOwner } from '../vmops.ts';

const spec = (p: string, usage: string, flags: CommandSpec['flags'], minArgs: number, maxArgs: number) =>
  ({ path: p, usage, flags, minArgs, maxArgs }) satisfies CommandSpec;

/** PAX records cocoon uses for sparse disk files in snapshot archives (registry.md §4). */
const SPARSE_SIZE = 'COCOON.sparse.size';
const SPARSE_MAP = 'COCOON.sparse.map';
/** The disk files of a run dir a snapshot keeps (with their content). */
const DISKS = ['cow.raw', 'overlay.qcow2', 'cidata.img'] as const;

function checkSnapshotName(name: string): void {
  if (!SNAPSHOT_NAME_RE.test(name)) {
    throw new CliError(`invalid snapshot name "${name}": must match ^[a-zA-Z0-9][a-zA-Z0-9._:/-]{0,62}$`);
  }
}

/** Reserves `record.name` as a pending snapshot owned by this process. */
export function reservePending(
  root: string,
  record: SnapshotRecord,
  ownerPid = io().owner.pid,
  ownerStart = io().owner.start,
): SnapshotRecord {
  return updateSnapDb(root, (db) => {
    const holder = db.names[record.name];
    const held = holder ? db.snapshots[holder] : undefined;
    if (held) {
      if (held.pending) throw new CliError(`snapshot name "${record.name}" already in use by ${held.id}`);
      throw new CliError(`snapshot name "${record.name}" already exists`);
    }
    let id = record.id && ID_RE.test(record.id) && !db.snapshots[record.id] ? record.id : newId();
    while (db.snapshots[id]) id = newId();
    const rec = { ...record, id, pending: true };
    db.snapshots[id] = rec;
    db.names[rec.name] = id;
    if (ownerPid) writeOwner(root, `snap-${id}`, ownerPid, ownerStart);
    return rec;
  });
}

function commitPending(root: string, id: string): SnapshotRecord {
  const rec = updateSnapDb(root, (db) => {
    const cur = db.snapshots[id];
    if (!cur) throw new CliError(`snapshot not found: ${id}`);
    const { pending: _pending, ...rest } = cur;
    const done: SnapshotRecord = { ...rest, created_at: nowIso() };
    db.snapshots[id] = done;
    return done;
  });
  fs.rmSync(ownerFile(root, `snap-${id}`), { force: true });
  return rec;
}

function dropSnapshot(root: string, id: string): void {
  updateSnapDb(root, (db) => {
    const cur = db.snapshots[id];
    if (!cur) return;
    delete db.snapshots[id];
    if (db.names[cur.name] === id) delete db.names[cur.name];
  });
  fs.rmSync(snapDataDir(root, id), { recursive: true, force: true });
  fs.rmSync(ownerFile(root, `snap-${id}`), { force: true });
  dropUses(root, id);
}

async function save(ctx: Ctx, p: Parsed): Promise<number> {
  const name = str(p, 'name');
  if (name === undefined) throw new CliError('required flag(s) "name" not set');
  checkSnapshotName(name);
  const { dir, vm } = mustFindVm(ctx.root, p.args[0] as string);
  const state = reconciledState(ctx.root, vm);
  if (state !== 'running')
    throw new CliError(`vm ${vm.id} is not running (state: ${state}); cannot snapshot`);
  const nics = vm.network_configs?.length ?? 0;
  const rec = reservePending(ctx.root, {
    id: '',
    name,
    cpu: vm.config.cpu ?? 2,
    memory: vm.config.memory ?? GiB,
    storage: vm.config.storage ?? 10 * GiB,
    image: vm.config.image ?? '',
    image_digest: vm.config.image_digest ?? '',
    image_type: vm.config.image_type ?? '',
    ...(vm.config.network ? { network: vm.config.network } : {}),
    image_blob_ids: vm.config.image_digest ? { [vm.config.image_digest.replace(/^sha256:/, '')]: {} } : {},
    hypervisor: vm.hypervisor,
    nics,
    ...(vm.config.windows ? { windows: true } : {}),
    created_at: nowIso(),
  });
  try {
    await ctx.latency();
    await ctx.faults('start', p, [name, vm.config.name]);
    const data = snapDataDir(ctx.root, rec.id);
    fs.mkdirSync(data, { recursive: true });
    fs.writeFileSync(path.join(data, 'config.json'), JSON.stringify(vm, null, 2));
    fs.writeFileSync(path.join(data, 'state.json'), JSON.stringify({ vm: vm.id, saved_at: nowIso() }));
    fs.writeFileSync(path.join(data, 'memory-range-0'), '');
    // The guest's disks keep their content (data copied, holes kept: sim/disk.ts).
    const rd = runDir(ctx.root, dir, vm.id);
    for (const f of DISKS) {
      const src = path.join(rd, f);
      const st = fs.statSync(src, { throwIfNoEntry: false });
      if (st?.isFile()) copySparse(src, path.join(data, f), st);
    }
  } catch (e) {
    dropSnapshot(ctx.root, rec.id);
    throw e;
  }
  const done = commitPending(ctx.root, rec.id);
  ctx.out(done.id);
  return 0;
}

async function inspect(ctx: Ctx, p: Parsed): Promise<number> {
  ctx.json(mustFindSnapshot(ctx.root, p.args[0] as string));
  return 0;
}

async function list(ctx: Ctx, p: Parsed): Promise<number> {
  const o = str(p, 'output') ?? 'table';
  if (o !== 'json' && o !== 'table')
    throw new CliError(`unsupported output format "${o}" (want json or table)`);
  const snaps = Object.values(readSnapDb(ctx.root).snapshots)
    .filter((s) => !s.pending)
    .sort((a, b) => a.created_at.localeCompare(b.created_at) || a.id.localeCompare(b.id));
  if (snaps.length === 0) {
    const mode = ctx.knobs.list?.empty ?? 'message';
    if (mode === 'message') ctx.out('No snapshots found.');
    else if (mode === '[]') ctx.out('[]');
    return 0;
  }
  if (o === 'json') ctx.json(snaps);
  else for (const s of snaps) ctx.out(`${s.id}\t${s.name}\t${s.hypervisor}\t${s.image}`);
  return 0;
}

/** Removes a snapshot (committed or pending). Refuses while an active user holds it. */
export function removeSnapshot(root: string, ref: string): SnapshotRecord {
  const rec = updateSnapDb(root, (db) => {
    const snap = findSnapshotIn(db, ref, true);
    if (!snap) throw new CliError(`snapshot not found: ${ref}`);
    if (snap.pending && ownerAlive(root, `snap-${snap.id}`)) {
      throw new CliError(`snapshot ${snap.name} (${snap.id}) is in use by an active save or import`);
    }
    const user = activeUse(root, snap.id);
    if (user) throw new CliError(`snapshot ${snap.name} (${snap.id}) is in use by an active ${user}`);
    delete db.snapshots[snap.id];
    if (db.names[snap.name] === snap.id) delete db.names[snap.name];
    return snap;
  });
  fs.rmSync(snapDataDir(root, rec.id), { recursive: true, force: true });
  fs.rmSync(ownerFile(root, `snap-${rec.id}`), { force: true });
  dropUses(root, rec.id);
  return rec;
}

async function rm(ctx: Ctx, p: Parsed): Promise<number> {
  for (const ref of p.args) {
    const rec = removeSnapshot(ctx.root, ref);
    ctx.out(`removed snapshot ${rec.name} (${rec.id})`);
  }
  return 0;
}

interface Envelope {
  version?: unknown;
  config?: Partial<SnapshotRecord> & { description?: string };
}

function safeEntryPath(name: string): string {
  const clean = path.posix.normalize(name.replace(/^\.\//, ''));
  if (clean.startsWith('/') || clean === '..' || clean.startsWith('../') || clean === '.') {
    throw new CliError(`invalid path in snapshot archive: ${name}`);
  }
  return clean;
}

async function importSnapshot(ctx: Ctx, p: Parsed): Promise<number> {
  const name = str(p, 'name');
  if (name === undefined) throw new CliError('required flag(s) "name" not set');
  checkSnapshotName(name);
  const { default: tar } = await import('tar-stream');
  const zlib = await import('node:zlib');
  const { Readable: ReadableStream } = await import('node:stream');
  const rec = reservePending(ctx.root, {
    id: '',
    name,
    cpu: 0,
    memory: 0,
    storage: 0,
    image: '',
    image_digest: '',
    image_type: '',
    image_blob_ids: {},
    hypervisor: '',
    nics: 0,
    created_at: nowIso(),
  });
  const data = snapDataDir(ctx.root, rec.id);
  try {
    await ctx.latency();
    await ctx.faults('start', p, [name]);
    fs.mkdirSync(data, { recursive: true });
    let envelope: Envelope | undefined;
    const extract = tar.extract();
    const consume = (async () => {
      for await (const entry of extract) {
        const h = entry.header;
        const rel = safeEntryPath(h.name);
        if (rel === 'snapshot.json') {
          const chunks: Buffer[] = [];
          for await (const c of entry) chunks.push(c as Buffer);
          try {
            envelope = JSON.parse(Buffer.concat(chunks).toString('utf8')) as Envelope;
          } catch (e) {
            throw new CliError(`parse snapshot.json: ${(e as Error).message}`);
          }
          if (envelope.version !== 1) {
            throw new CliError(`unsupported snapshot archive version ${String(envelope.version)}`);
          }
          continue;
        }
        if (h.type === 'directory') {
          fs.mkdirSync(path.join(data, rel), { recursive: true });
          entry.resume();
          continue;
        }
        if (h.type !== 'file' && h.type !== 'contiguous-file') {
          entry.resume();
          continue;
        }
        const target = path.join(data, rel);
        fs.mkdirSync(path.dirname(target), { recursive: true });
        const mode = (h.mode ?? 0o640) & 0o777;
        const pax = (h.pax ?? {}) as Record<string, string>;
        const sparseSize = Number(pax[SPARSE_SIZE]);
        const sized = pax[SPARSE_SIZE] !== undefined && Number.isSafeInteger(sparseSize) && sparseSize >= 0;
        let segments: Segment[] | undefined;
        if (pax[SPARSE_MAP] !== undefined && sized) {
          try {
            segments = decodeSparseMap(pax[SPARSE_MAP], sparseSize, h.size ?? 0);
          } catch (e) {
            throw new CliError(`invalid ${SPARSE_MAP} for ${rel}: ${(e as Error).message}`);
          }
        }
        if (segments) {
          // A sparse entry: its data is the data segments, written back at their offsets.
          const file = openOnce(ctx, target, 'w', mode);
          const writer = new SegmentWriter(file.fd, segments);
          for await (const c of entry) writer.write(c as Buffer);
          fs.ftruncateSync(file.fd, sparseSize);
          file.close();
          continue;
        }
        // A plain entry (or a map that is not JSON: opaque, its data lands from offset 0).
        await pipeline(entry, fs.createWriteStream(target, { mode }));
        if (sized && sparseSize > fs.statSync(target).size) fs.truncateSync(target, sparseSize);
      }
    })();
    // Count stdin bytes; sniff gzip from the first two bytes.
    const chunks = (async function* () {
      for await (const c of ctx.io.stdin) {
        ctx.stdinBytes += (c as Buffer).length;
        yield c as Buffer;
      }
    })();
    let head = Buffer.alloc(0);
    let ended = false;
    while (head.length < 2) {
      const r = await chunks.next();
      if (r.done) {
        ended = true;
        break;
      }
      head = Buffer.concat([head, r.value]);
    }
    const gz = head[0] === 0x1f && head[1] === 0x8b;
    const source = ReadableStream.from(
      (async function* () {
        if (head.length > 0) yield head;
        if (!ended) yield* chunks;
      })(),
    );
    await Promise.all([
      gz ? pipeline(source, zlib.createGunzip(), extract) : pipeline(source, extract),
      consume,
    ]);
    if (!envelope?.config) throw new CliError('snapshot archive has no snapshot.json');
    const c = envelope.config;
    const description = str(p, 'description') ?? c.description;
    updateSnapDb(ctx.root, (db) => {
      const cur = db.snapshots[rec.id];
      if (!cur) throw new CliError(`snapshot not found: ${rec.id}`);
      db.snapshots[rec.id] = {
        ...cur,
        ...(description ? { description } : {}),
        cpu: c.cpu ?? 2,
        memory: c.memory ?? 2 * GiB,
        storage: c.storage ?? 20 * GiB,
        image: c.image ?? '',
        image_digest: c.image_digest ?? '',
        image_type: c.image_type ?? '',
        ...(c.network ? { network: c.network } : {}),
        image_blob_ids: c.image_blob_ids ?? {},
        hypervisor: c.hypervisor ?? 'cloud-hypervisor',
        nics: c.nics ?? 1,
        ...(c.windows ? { windows: true } : {}),
      };
    });
    // Keep the archive's snapshot id when it is a valid, unused cocoon id.
    const wanted = c.id;
    let finalId = rec.id;
    if (wanted && ID_RE.test(wanted) && wanted !== rec.id) {
      finalId = updateSnapDb(ctx.root, (db) => {
        const cur = db.snapshots[rec.id];
        if (!cur || db.snapshots[wanted]) return rec.id;
        delete db.snapshots[rec.id];
        db.snapshots[wanted] = { ...cur, id: wanted };
        db.names[cur.name] = wanted;
        return wanted;
      });
      if (finalId !== rec.id) {
        fs.renameSync(data, snapDataDir(ctx.root, finalId));
        fs.rmSync(ownerFile(ctx.root, `snap-${rec.id}`), { force: true });
        writeOwner(ctx.root, `snap-${finalId}`, ctx.io.owner.pid, ctx.io.owner.start);
      }
    }
    const done2 = commitPending(ctx.root, finalId);
    ctx.out(done2.id);
    return 0;
  } catch (e) {
    const cur = findSnapshotIn(readSnapDb(ctx.root), name, true);
    if (cur?.pending) dropSnapshot(ctx.root, cur.id);
    fs.rmSync(data, { recursive: true, force: true });
    throw e;
  }
}

async function exportSnapshot(ctx: Ctx, p: Parsed): Promise<number> {
  const out = str(p, 'output');
  if (out === undefined) throw new CliError('required flag(s) "output" not set');
  const { default: tar } = await import('tar-stream');
  const snap = mustFindSnapshot(ctx.root, p.args[0] as string);
  addUse(ctx.root, snap.id, 'export', ctx.io.owner.pid, ctx.io.owner.start);
  try {
    const data = snapDataDir(ctx.root, snap.id);
    const pack = tar.pack();
    // stdout is never ended by a verb (run.ts flushes it), so wait for the pack to end instead.
    const piping =
      out === '-'
        ? new Promise<void>((resolve, reject) => {
            pack.on('end', resolve).on('error', reject);
            (pack as unknown as Readable).pipe(ctx.io.stdout, { end: false });
          })
        : pipeline(pack, fs.createWriteStream(path.resolve(ctx.io.cwd, out)));
    const envelope = {
      version: 1,
      config: {
        id: snap.id,
        name: snap.name,
        description: snap.description ?? '',
        image: snap.image,
        image_digest: snap.image_digest,
        image_type: snap.image_type,
        image_blob_ids: snap.image_blob_ids,
        hypervisor: snap.hypervisor,
        cpu: snap.cpu,
        memory: snap.memory,
        storage: snap.storage,
        nics: snap.nics,
        network: snap.network ?? '',
        windows: snap.windows === true,
      },
    };
    const mtime = new Date();
    pack.entry({ name: 'snapshot.json', mode: 0o644, mtime }, JSON.stringify(envelope));
    const files = fs.existsSync(data) ? listFiles(data) : [];
    const pause = () => ctx.io.gate(new Promise<void>((r) => setImmediate(r)));
    for (const rel of files) {
      const full = path.join(data, rel);
      const st = fs.statSync(full);
      const plan = await planExport(full, pause);
      const header = { name: rel, mode: st.mode & 0o777, mtime };
      if (plan.sparse) {
        // cocoon's sparse entry: only the data segments travel; the PAX records say where they
        // go and the apparent size (an all-hole disk: size 0, map []).
        const dataSize = plan.segments.reduce((n, [, len]) => n + len, 0);
        const file = openOnce(ctx, full, 'r');
        await ctx.io.gate(
          new Promise<void>((resolve, reject) => {
            const entry = pack.entry(
              {
                ...header,
                size: dataSize,
                pax: { [SPARSE_SIZE]: String(plan.size), [SPARSE_MAP]: encodeSparseMap(plan.segments) },
              },
              (err) => (err ? reject(err) : resolve()),
            );
            Readable.from(readSegments(file.fd, plan.segments), { objectMode: false })
              .on('error', reject)
              .pipe(entry);
          }),
        );
        file.close();
        continue;
      }
      await ctx.io.gate(
        new Promise<void>((resolve, reject) => {
          const entry = pack.entry({ ...header, size: plan.size }, (err) => (err ? reject(err) : resolve()));
          fs.createReadStream(full).on('error', reject).pipe(entry);
        }),
      );
    }
    pack.finalize();
    await piping;
  } finally {
    releaseSnapshotUse(ctx.root, snap.id, 'export');
  }
  return 0;
}

/**
 * Opens `file` and closes it once: by `close()`, or when the invocation ends however it ends
 * (a server request abandoned by a killed caller runs no finally).
 */
function openOnce(ctx: Ctx, file: string, flags: string, mode?: number): { fd: number; close(): void } {
  const fd = fs.openSync(file, flags, mode);
  let open = true;
  const close = () => {
    if (!open) return;
    open = false;
    fs.closeSync(fd);
  };
  ctx.io.defer(close);
  return { fd, close };
}

function listFiles(dir: string, prefix = ''): string[] {
  const out: string[] = [];
  for (const d of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
    const rel = prefix ? `${prefix}/${d.name}` : d.name;
    if (d.isDirectory()) out.push(...listFiles(path.join(dir, d.name), rel));
    else if (d.isFile()) out.push(rel);
  }
  return out;
}

export const verbs: Record<string, Verb> = {
  save: {
    spec: spec(
      'snapshot save',
      'snapshot save --name NAME VM',
      [
        { name: 'name', type: 'string' },
        { name: 'description', type: 'string' },
      ],
      1,
      1,
    ),
    reserving: true,
    run: save,
  },
  inspect: { spec: spec('snapshot inspect', 'snapshot inspect SNAPSHOT', [], 1, 1), run: inspect },
  rm: { spec: spec('snapshot rm', 'snapshot rm SNAPSHOT [SNAPSHOT...]', [], 1, Infinity), run: rm },
  list: {
    spec: spec(
      'snapshot list',
      'snapshot list [-o json]',
      [{ name: 'output', short: 'o', type: 'string' }],
      0,
      0,
    ),
    run: list,
  },
  import: {
    spec: spec(
      'snapshot import',
      'snapshot import --name NAME [--description TEXT] < archive.tar',
      [
        { name: 'name', type: 'string' },
        { name: 'description', type: 'string' },
      ],
      0,
      0,
    ),
    reserving: true,
    run: importSnapshot,
  },
  export: {
    spec: spec(
      'snapshot export',
      'snapshot export SNAPSHOT -o FILE|-',
      [{ name: 'output', short: 'o', type: 'string' }],
      1,
      1,
    ),
    run: exportSnapshot,
  },
};
