// Guest disk content (docs/simulator.md, "Disk content" and "Sparse export"): a marker written
// into a VM's COW disk survives snapshot save → export → import → clone (what hibernate and
// wake do through a registry), for cloud-hypervisor, firecracker and cloud-image VMs; sparse
// disks export as cocoon does (only the data segments, PAX COCOON.sparse.map/.size) and come
// back byte-identical with their holes (also when scattered over a 20 GiB disk); --from-dir
// clones keep content; an all-hole placeholder still exports as a 0-byte entry and clones
// without being read; import expands sparse entries written by other tools.
import assert from 'node:assert/strict';
import { type ChildProcess, spawnSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import tar from 'tar-stream';
import { newSimRoot, type SimRoot, type SnapshotRecord, type VmRecord } from '../../sim/client.ts';

const IMAGE = 'ghcr.io/acme/agent:7';
const CLOUD = 'https://cloud-images.example.com/jammy/server-cloudimg-amd64.img';
const MiB = 1024 * 1024;

interface TarEntry {
  name: string;
  size: number;
  mode: number;
  data: Buffer;
  pax?: Record<string, string>;
}

async function untar(buf: Buffer): Promise<TarEntry[]> {
  const out: TarEntry[] = [];
  const ex = tar.extract();
  const done = (async () => {
    for await (const entry of ex) {
      const chunks: Buffer[] = [];
      for await (const c of entry) chunks.push(c as Buffer);
      out.push({
        name: entry.header.name,
        size: entry.header.size ?? 0,
        mode: entry.header.mode ?? 0,
        data: Buffer.concat(chunks),
        ...(entry.header.pax ? { pax: entry.header.pax as Record<string, string> } : {}),
      });
    }
  })();
  ex.end(buf);
  await done;
  return out;
}

async function makeTar(
  entries: { name: string; data: string | Buffer; pax?: Record<string, string> }[],
): Promise<Buffer> {
  const pack = tar.pack();
  for (const e of entries) {
    pack.entry({ name: e.name, mode: 0o640, ...(e.pax ? { pax: e.pax } : {}) }, e.data);
  }
  pack.finalize();
  const chunks: Buffer[] = [];
  for await (const c of pack) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

function exited(child: ChildProcess): Promise<number | null> {
  if (child.exitCode !== null) return Promise.resolve(child.exitCode);
  return new Promise((resolve) => child.once('exit', (code) => resolve(code)));
}

function diskOf(vm: VmRecord, role: 'cow' | 'cidata'): string {
  const p = vm.storage_configs?.find((s) => s.role === role)?.path;
  assert.ok(p, `${vm.config.name} has a ${role} disk`);
  return p;
}

function sha256(file: string): string {
  return crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');
}

function hasPerl(): boolean {
  return spawnSync('perl', ['-e', '1'], { stdio: 'ignore' }).status === 0;
}

const pageAlign = (n: number, up: boolean) => (up ? Math.ceil(n / 4096) : Math.floor(n / 4096)) * 4096;

describe('guest disk content', { concurrency: 1 }, () => {
  let sim: SimRoot;

  const clone = (name: string, snap: string) =>
    sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', name, snap]);
  const dataDir = (snap: SnapshotRecord) => path.join(sim.root, 'snapshot', 'localfile', snap.id);

  /** save → vm rm → export → import --name <to>; returns the export's tar bytes. */
  async function hibernate(vm: string, to: string): Promise<Buffer> {
    const saved = await sim.run(['snapshot', 'save', '--name', `${to}-saved`, vm]);
    assert.equal(saved.code, 0, saved.stderr);
    assert.equal((await sim.run(['vm', 'rm', '--force', vm])).code, 0);
    const exp = await sim.run(['snapshot', 'export', `${to}-saved`, '-o', '-']);
    assert.equal(exp.code, 0, exp.stderr);
    const imp = await sim.run(['snapshot', 'import', '--name', to], { stdin: exp.stdoutBytes });
    assert.equal(imp.code, 0, imp.stderr);
    return exp.stdoutBytes;
  }

  before(async () => {
    sim = await newSimRoot();
    await sim.fixtureSnapshot('ch-base', { backend: 'cloud-hypervisor', image: IMAGE, pulled: true });
    await sim.fixtureSnapshot('fc-base', { backend: 'firecracker', image: IMAGE, pulled: true });
    await sim.fixtureSnapshot('cloud-base', { backend: 'cloud-hypervisor', image: CLOUD, pulled: true });
    await sim.fixtureSnapshot('small-base', {
      backend: 'cloud-hypervisor',
      image: IMAGE,
      pulled: true,
      storage: 64 * MiB,
    });
  });
  after(async () => {
    await sim.cleanup();
  });

  test('__sim disk-write / disk-read: marker at offset 0 of the COW disk; errors', async () => {
    const vm = await clone('vk-marker', 'ch-base');
    assert.equal(await sim.diskRead('vk-marker'), '', 'a fresh disk reads as an empty line');
    const w = await sim.run(['__sim', 'disk-write', vm.id, '--', 'state: 42 ünïcode']);
    assert.deepEqual([w.code, w.stdout, w.stderr], [0, '', ''], 'disk-write prints nothing');
    const r = await sim.run(['__sim', 'disk-read', 'vk-marker']);
    assert.deepEqual([r.code, r.stdout], [0, 'state: 42 ünïcode\n']);
    await sim.diskWrite('vk-marker', 'ab');
    assert.equal(await sim.diskRead('vk-marker'), 'ab', 'reads up to the first NUL');
    const cow = fs.statSync(diskOf(vm, 'cow'));
    assert.equal(cow.size, vm.config.storage, 'the apparent size is unchanged');
    assert.ok(cow.blocks * 512 <= 8192, 'only the written page is allocated');
    const missing = await sim.run(['__sim', 'disk-read', 'vk-nope']);
    assert.deepEqual([missing.code, missing.stderr], [1, 'Error: vm not found: vk-nope\n']);
    const long = await sim.run(['__sim', 'disk-write', 'vk-marker', 'x'.repeat(4096)]);
    assert.equal(long.code, 1);
    assert.match(long.stderr, /longer than 4095 bytes/);
    const calls = sim.calls().filter((c) => c.argv[0] === '__sim');
    assert.equal(calls.length, 0, '__sim actions are not logged');
  });

  test('cloud-hypervisor: marker survives save → rm → export | import → clone', async () => {
    await clone('vk-ch', 'ch-base');
    await sim.diskWrite('vk-ch', 'ch marker before hibernate');
    // Pipe the export into the import, as two concurrent cocoon calls.
    assert.equal((await sim.run(['snapshot', 'save', '--name', 'ch-saved', 'vk-ch'])).code, 0);
    assert.equal((await sim.run(['vm', 'rm', '--force', 'vk-ch'])).code, 0);
    const exp = sim.spawn(['snapshot', 'export', 'ch-saved', '-o', '-']);
    const imp = sim.spawn(['snapshot', 'import', '--name', 'ch-woken']);
    exp.stdout?.pipe(imp.stdin as NodeJS.WritableStream);
    const errs: string[] = [];
    exp.stderr?.on('data', (d: Buffer) => errs.push(d.toString()));
    imp.stderr?.on('data', (d: Buffer) => errs.push(d.toString()));
    assert.deepEqual([await exited(exp), await exited(imp)], [0, 0], errs.join(''));
    const woke = await clone('vk-ch-woke', 'ch-woken');
    assert.equal(await sim.diskRead('vk-ch-woke'), 'ch marker before hibernate');
    const cow = fs.statSync(diskOf(woke, 'cow'));
    assert.equal(cow.size, woke.config.storage, 'the clone keeps the apparent size');
    assert.ok(cow.blocks * 512 <= 8192, 'and the holes');
    // The clone's disk is its own: writing it leaves the snapshot alone.
    await sim.diskWrite('vk-ch-woke', 'changed');
    assert.equal(
      await sim.diskRead((await clone('vk-ch-woke2', 'ch-woken')).id),
      'ch marker before hibernate',
    );
  });

  test('firecracker: marker survives the round trip; the archive carries a sparse cow.raw', async () => {
    const vm = await clone('vk-fc', 'fc-base');
    assert.equal(vm.hypervisor, 'firecracker');
    await sim.diskWrite('vk-fc', 'fc marker');
    const raw = await hibernate('vk-fc', 'fc-woken');
    const cow = (await untar(raw)).find((e) => e.name === 'cow.raw');
    assert.ok(cow, 'cow.raw travels');
    assert.equal(cow.pax?.['COCOON.sparse.size'], String(vm.config.storage));
    assert.equal(cow.pax?.['COCOON.sparse.map'], '[[0,4096]]');
    assert.equal(cow.size, 4096, 'only the data segment is in the archive');
    assert.equal(cow.data.subarray(0, 10).toString(), 'fc marker\0');
    const woke = await clone('vk-fc-woke', 'fc-woken');
    assert.equal(woke.hypervisor, 'firecracker');
    assert.equal(await sim.diskRead('vk-fc-woke'), 'fc marker');
  });

  test('cloud image: overlay.qcow2 and cidata.img keep their content', async () => {
    const vm = await clone('vk-cloud', 'cloud-base');
    assert.match(diskOf(vm, 'cow'), /overlay\.qcow2$/);
    await sim.diskWrite('vk-cloud', 'cloud marker');
    const seed = Buffer.from('#cloud-config\nhostname: vk-cloud\n');
    const fd = fs.openSync(diskOf(vm, 'cidata'), 'r+');
    fs.writeSync(fd, seed, 0, seed.length, 8192 + 17);
    fs.closeSync(fd);
    const cidataSize = fs.statSync(diskOf(vm, 'cidata')).size;
    const raw = await hibernate('vk-cloud', 'cloud-woken');
    const entries = await untar(raw);
    assert.ok(entries.some((e) => e.name === 'overlay.qcow2'));
    const woke = await clone('vk-cloud-woke', 'cloud-woken');
    assert.equal(await sim.diskRead('vk-cloud-woke'), 'cloud marker');
    const cidata = fs.readFileSync(diskOf(woke, 'cidata'));
    assert.equal(cidata.length, cidataSize);
    assert.deepEqual(cidata.subarray(8192 + 17, 8192 + 17 + seed.length), seed);
  });

  test('a 64 MiB disk with two data regions exports with a sparse map and round-trips byte-identical', async () => {
    const vm = await clone('vk-sparse', 'small-base');
    const cowPath = diskOf(vm, 'cow');
    assert.equal(fs.statSync(cowPath).size, 64 * MiB);
    const a = { at: MiB + 3000, data: crypto.randomBytes(1.5 * MiB) };
    const b = { at: 40 * MiB + 123, data: crypto.randomBytes(100 * 1024) };
    const fd = fs.openSync(cowPath, 'r+');
    for (const r of [a, b]) fs.writeSync(fd, r.data, 0, r.data.length, r.at);
    fs.closeSync(fd);
    const want = sha256(cowPath);
    const raw = await hibernate('vk-sparse', 'sparse-woken');
    const entries = await untar(raw);
    const cow = entries.find((e) => e.name === 'cow.raw');
    assert.ok(cow);
    const map = JSON.parse(cow.pax?.['COCOON.sparse.map'] ?? 'null') as [number, number][];
    const segment = (r: typeof a): [number, number] => {
      const start = pageAlign(r.at, false);
      return [start, pageAlign(r.at + r.data.length, true) - start];
    };
    assert.deepEqual(map, [segment(a), segment(b)], 'page-aligned data segments, holes left out');
    assert.equal(cow.pax?.['COCOON.sparse.size'], String(64 * MiB));
    assert.equal(
      cow.size,
      map.reduce((n, [, len]) => n + len, 0),
      'the entry holds only the segments',
    );
    assert.ok(raw.length < 2 * MiB, `the archive is small (${raw.length} bytes)`);
    const config = entries.find((e) => e.name === 'config.json');
    assert.ok(config && !config.pax, 'files without holes are plain entries');

    const imported = await sim.json<SnapshotRecord>(['snapshot', 'inspect', 'sparse-woken']);
    const importedCow = path.join(dataDir(imported), 'cow.raw');
    assert.equal(sha256(importedCow), want, 'import restores the bytes');
    assert.ok(fs.statSync(importedCow).blocks * 512 < 4 * MiB, 'and the holes');
    const woke = await clone('vk-sparse-woke', 'sparse-woken');
    assert.equal(sha256(diskOf(woke, 'cow')), want, 'the clone has the same bytes');
    assert.ok(fs.statSync(diskOf(woke, 'cow')).blocks * 512 < 4 * MiB);
  });

  test('scattered writes across a 20 GiB disk (more extents than st_blocks can prove) round-trip quickly', {
    skip: hasPerl() ? false : 'no perl: the scan reads the whole disk',
    timeout: 120_000,
  }, async () => {
    const vm = await clone('vk-scatter', 'ch-base');
    const cowPath = diskOf(vm, 'cow');
    const size = fs.statSync(cowPath).size;
    assert.equal(size, 20 * 1024 * MiB);
    const writes = Array.from({ length: 8 }, (_, i) => ({
      at: Math.floor((size / 8) * i) + i * 8192 + 100,
      data: crypto.randomBytes(5000),
    }));
    const fd = fs.openSync(cowPath, 'r+');
    for (const w of writes) fs.writeSync(fd, w.data, 0, w.data.length, w.at);
    fs.closeSync(fd);
    const raw = await hibernate('vk-scatter', 'scatter-woken');
    const cow = (await untar(raw)).find((e) => e.name === 'cow.raw');
    const map = JSON.parse(cow?.pax?.['COCOON.sparse.map'] ?? 'null') as [number, number][];
    assert.deepEqual(
      map,
      writes.map((w): [number, number] => {
        const start = pageAlign(w.at, false);
        return [start, pageAlign(w.at + w.data.length, true) - start];
      }),
    );
    const woke = await clone('vk-scatter-woke', 'scatter-woken');
    const out = fs.openSync(diskOf(woke, 'cow'), 'r');
    for (const w of writes) {
      const got = Buffer.alloc(w.data.length);
      fs.readSync(out, got, 0, got.length, w.at);
      assert.deepEqual(got, w.data, `region at ${w.at}`);
    }
    fs.closeSync(out);
    assert.equal(fs.statSync(diskOf(woke, 'cow')).size, size);
  });

  test('--from-dir clones keep the disk content', async () => {
    const vm = await clone('vk-dir', 'small-base');
    await sim.diskWrite('vk-dir', 'from-dir marker');
    const extra = crypto.randomBytes(5000);
    const fd = fs.openSync(diskOf(vm, 'cow'), 'r+');
    fs.writeSync(fd, extra, 0, extra.length, 20 * MiB);
    fs.closeSync(fd);
    const want = sha256(diskOf(vm, 'cow'));
    const raw = await hibernate('vk-dir', 'dir-woken');
    // A directory holding what the archive holds: snapshot.json and the data files.
    const dir = path.join(sim.dir, 'from-dir');
    fs.mkdirSync(dir);
    const envelope = (await untar(raw)).find((e) => e.name === 'snapshot.json');
    assert.ok(envelope);
    fs.writeFileSync(path.join(dir, 'snapshot.json'), envelope.data);
    const snap = await sim.json<SnapshotRecord>(['snapshot', 'inspect', 'dir-woken']);
    for (const f of fs.readdirSync(dataDir(snap)))
      fs.copyFileSync(path.join(dataDir(snap), f), path.join(dir, f));
    const woke = await sim.json<VmRecord>([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'vk-dir-woke',
      '--from-dir',
      dir,
    ]);
    assert.equal(await sim.diskRead('vk-dir-woke'), 'from-dir marker');
    assert.equal(sha256(diskOf(woke, 'cow')), want);
  });

  test('an all-hole placeholder exports as a 0-byte entry and clones without content', async () => {
    const vm = await clone('vk-hole', 'ch-base');
    const raw = await hibernate('vk-hole', 'hole-woken');
    const cow = (await untar(raw)).find((e) => e.name === 'cow.raw');
    assert.ok(cow);
    assert.equal(cow.size, 0);
    assert.equal(cow.pax?.['COCOON.sparse.size'], String(vm.config.storage));
    assert.equal(cow.pax?.['COCOON.sparse.map'], '[]');
    const snap = await sim.json<SnapshotRecord>(['snapshot', 'inspect', 'hole-woken']);
    const st = fs.statSync(path.join(dataDir(snap), 'cow.raw'));
    assert.deepEqual([st.size, st.blocks], [vm.config.storage, 0]);
    const woke = await clone('vk-hole-woke', 'hole-woken');
    const cowSt = fs.statSync(diskOf(woke, 'cow'));
    assert.deepEqual([cowSt.size, cowSt.blocks], [vm.config.storage, 0]);
    assert.equal(await sim.diskRead('vk-hole-woke'), '');
  });

  test('import: a sparse entry written by another tool (the provider) is expanded; a bad map is refused; a non-JSON map is opaque', async () => {
    const envelope = JSON.stringify({
      version: 1,
      config: { name: 'x', image: IMAGE, image_type: 'oci', hypervisor: 'cloud-hypervisor', nics: 1 },
    });
    const seg1 = Buffer.from('hand-made marker\0');
    const seg2 = Buffer.alloc(3000, 0xab);
    const ok = await makeTar([
      { name: 'snapshot.json', data: envelope },
      {
        name: 'cow.raw',
        data: Buffer.concat([seg1, seg2]),
        pax: {
          'COCOON.sparse.map': JSON.stringify([
            [0, seg1.length],
            [5 * MiB + 7, seg2.length],
          ]),
          'COCOON.sparse.size': String(8 * MiB),
        },
      },
      { name: 'cidata.img', data: '', pax: { 'COCOON.sparse.map': '[]', 'COCOON.sparse.size': String(MiB) } },
    ]);
    const r = await sim.run(['snapshot', 'import', '--name', 'hand-made'], { stdin: ok });
    assert.equal(r.code, 0, r.stderr);
    const snap = await sim.json<SnapshotRecord>(['snapshot', 'inspect', 'hand-made']);
    const cow = fs.readFileSync(path.join(dataDir(snap), 'cow.raw'));
    assert.equal(cow.length, 8 * MiB);
    assert.deepEqual(cow.subarray(0, seg1.length), seg1);
    assert.deepEqual(cow.subarray(5 * MiB + 7, 5 * MiB + 7 + seg2.length), seg2);
    assert.equal(
      cow.subarray(seg1.length, 5 * MiB + 7).some((x) => x !== 0),
      false,
    );
    const cidata = fs.statSync(path.join(dataDir(snap), 'cidata.img'));
    assert.deepEqual([cidata.size, cidata.blocks], [MiB, 0]);
    await clone('vk-hand-made', 'hand-made');
    assert.equal(await sim.diskRead('vk-hand-made'), 'hand-made marker');

    const bad = await makeTar([
      { name: 'snapshot.json', data: envelope },
      {
        name: 'cow.raw',
        data: 'abc',
        pax: { 'COCOON.sparse.map': '[[0,2]]', 'COCOON.sparse.size': '100' },
      },
    ]);
    const r2 = await sim.run(['snapshot', 'import', '--name', 'bad-map'], { stdin: bad });
    assert.equal(r2.code, 1);
    assert.match(r2.stderr, /invalid COCOON\.sparse\.map for cow\.raw: segments hold 2 bytes, the entry 3/);
    assert.equal((await sim.run(['snapshot', 'inspect', 'bad-map'])).code, 1, 'nothing is left');

    // A map that is not JSON is opaque: the data lands from offset 0, the size is restored.
    const opaque = await makeTar([
      { name: 'snapshot.json', data: envelope },
      {
        name: 'cow.raw',
        data: 'opaque\0',
        pax: { 'COCOON.sparse.map': '0,4096', 'COCOON.sparse.size': String(MiB) },
      },
    ]);
    const r3 = await sim.run(['snapshot', 'import', '--name', 'opaque-map'], { stdin: opaque });
    assert.equal(r3.code, 0, r3.stderr);
    const opaqueSnap = await sim.json<SnapshotRecord>(['snapshot', 'inspect', 'opaque-map']);
    const opaqueCow = fs.readFileSync(path.join(dataDir(opaqueSnap), 'cow.raw'));
    assert.deepEqual([opaqueCow.length, opaqueCow.subarray(0, 7).toString()], [MiB, 'opaque\0']);
  });
});
