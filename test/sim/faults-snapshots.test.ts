// Fault and latency knobs (cocoon-cli.md §8.5) and snapshots (§2, §3.2, §3.4, §8.7): save
// preconditions and name conflicts, pending records, in-use refusal, export → import round
// trip (plain and gzip), archive version rejection.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { gzipSync } from 'node:zlib';
import tar from 'tar-stream';
import { newSimRoot, type SimRoot, type SnapshotRecord, type VmRecord } from '../../sim/client.ts';

const IMAGE = 'ghcr.io/acme/agent:6';

async function untar(
  buf: Buffer,
): Promise<{ name: string; size: number; data: Buffer; pax?: Record<string, string> }[]> {
  const out: { name: string; size: number; data: Buffer; pax?: Record<string, string> }[] = [];
  const ex = tar.extract();
  const done = (async () => {
    for await (const entry of ex) {
      const chunks: Buffer[] = [];
      for await (const c of entry) chunks.push(c as Buffer);
      out.push({
        name: entry.header.name,
        size: entry.header.size ?? 0,
        data: Buffer.concat(chunks),
        ...(entry.header.pax ? { pax: entry.header.pax as Record<string, string> } : {}),
      });
    }
  })();
  ex.end(buf);
  await done;
  return out;
}

async function makeTar(entries: { name: string; data: string | Buffer }[]): Promise<Buffer> {
  const pack = tar.pack();
  for (const e of entries) pack.entry({ name: e.name, mode: 0o644 }, e.data);
  pack.finalize();
  const chunks: Buffer[] = [];
  for await (const c of pack) chunks.push(c as Buffer);
  return Buffer.concat(chunks);
}

describe('faults, latency and snapshots', { concurrency: 1 }, () => {
  let sim: SimRoot;
  let vm: VmRecord;

  before(async () => {
    sim = await newSimRoot();
    await sim.fixtureSnapshot('base', { backend: 'cloud-hypervisor', image: IMAGE, pulled: true });
    vm = await sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', 'vk-snap', 'base']);
  });
  after(async () => {
    await sim.cleanup();
  });

  test('a fault with times fails N invocations (counted across processes), then cocoon behaves', async () => {
    await sim.setKnobs({
      faults: [{ argvRegex: '^vm inspect ', match: '^vk-snap$', error: 'database is locked', times: 2 }],
    });
    const rs = [];
    for (let i = 0; i < 3; i++) rs.push(await sim.run(['vm', 'inspect', vm.id]));
    assert.deepEqual(
      rs.map((r) => [r.code, r.stderr]),
      [
        [1, 'Error: database is locked\n'],
        [1, 'Error: database is locked\n'],
        [0, ''],
      ],
    );
    assert.equal(JSON.parse(rs[2]?.stdout ?? '').id, vm.id, 'match resolves the id to the VM name');
  });

  test('fault stdout/exit verbatim, probability 0 never fires, hang never returns', async () => {
    await sim.setKnobs({
      faults: [
        { argvRegex: '^vm list', probability: 0, error: 'never' },
        { argvRegex: '^vm list', exit: 0, stdout: '{not json' },
        { argvRegex: '^snapshot inspect', hang: true },
      ],
    });
    const list = await sim.run(['vm', 'list', '-o', 'json']);
    assert.deepEqual([list.code, list.stdout, list.stderr], [0, '{not json', '']);
    const hung = await sim.run(['snapshot', 'inspect', 'base'], { timeoutMs: 1500 });
    assert.equal(hung.signal, 'SIGKILL');
    assert.ok(hung.durationMs >= 1400);
    assert.ok(
      !sim.calls().some((c) => c.argv[0] === 'snapshot' && c.argv[1] === 'inspect'),
      'a killed call logs nothing',
    );
    await sim.setKnobs({});
  });

  test('latency knob delays the verb', async () => {
    await sim.setKnobs({ latency: { 'vm inspect': 700 } });
    await sim.run(['vm', 'inspect', vm.id]);
    const call = sim
      .calls()
      .filter((c) => c.argv[1] === 'inspect')
      .pop();
    assert.ok((call?.durationMs ?? 0) >= 700, `durationMs ${call?.durationMs}`);
    await sim.setKnobs({});
  });

  test('an invalid knob file fails every verb loudly', async () => {
    const fs = await import('node:fs');
    fs.writeFileSync(sim.knobsPath, JSON.stringify({ dhcp: { leaseDelay: 5 } }));
    const r = await sim.run(['vm', 'list']);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /^Error: sim config .*dhcp/);
    await sim.setKnobs({});
  });

  test('snapshot save: requires a running VM; taken names are reported verbatim', async () => {
    const saved = await sim.run(['snapshot', 'save', '--name', 'vk-snap', vm.id]);
    assert.equal(saved.code, 0, saved.stderr);
    const info = await sim.json<SnapshotRecord>(['snapshot', 'inspect', 'vk-snap']);
    assert.equal(info.id, saved.stdout.trim());
    assert.equal(info.hypervisor, 'cloud-hypervisor');
    assert.equal(info.image, IMAGE);
    assert.equal(info.nics, 1);
    const again = await sim.run(['snapshot', 'save', '--name', 'vk-snap', vm.id]);
    assert.equal(again.stderr, 'Error: snapshot name "vk-snap" already exists\n');
    const pending = JSON.parse(
      (await sim.run(['__sim', 'pending-snapshot', 'vk-pending', '--busy'])).stdout,
    ) as {
      id: string;
    };
    const blocked = await sim.run(['snapshot', 'save', '--name', 'vk-pending', vm.id]);
    assert.equal(blocked.stderr, `Error: snapshot name "vk-pending" already in use by ${pending.id}\n`);
    const leased = await sim.run(['snapshot', 'rm', pending.id]);
    assert.equal(leased.code, 1);
    assert.match(leased.stderr, /is in use by an active/);
    assert.match(
      (await sim.run(['snapshot', 'inspect', 'vk-pending'])).stderr,
      /snapshot not found/,
      'pending is hidden',
    );
    const stale = JSON.parse((await sim.run(['__sim', 'pending-snapshot', 'vk-stale-pending'])).stdout) as {
      id: string;
    };
    assert.equal(
      (await sim.run(['snapshot', 'rm', stale.id])).code,
      0,
      'a pending record without a live owner is removable',
    );
    await sim.run(['__sim', 'crash', vm.id]);
    const stopped = await sim.run(['snapshot', 'save', '--name', 'vk-snap-2', vm.id]);
    assert.equal(stopped.code, 1);
    assert.match(stopped.stderr, /not running/);
    await sim.run(['vm', 'start', vm.id]);
  });

  test('snapshot rm: not found is an error naming "snapshot not found"; in-use is refused', async () => {
    const miss = await sim.run(['snapshot', 'rm', 'no-such-snapshot']);
    assert.deepEqual([miss.code, miss.stderr], [1, 'Error: snapshot not found: no-such-snapshot\n']);
    await sim.run(['__sim', 'hold-snapshot', 'vk-snap', '--kind', 'clone']);
    const inUse = await sim.run(['snapshot', 'rm', 'vk-snap']);
    assert.equal(inUse.code, 1);
    assert.match(inUse.stderr, /is in use by an active clone/);
  });

  test('export → import round trip (plain and gzip) keeps the envelope fields', async () => {
    const exp = await sim.run(['snapshot', 'export', 'vk-snap', '-o', '-']);
    assert.equal(exp.code, 0, exp.stderr);
    const raw = exp.stdoutBytes;
    const entries = await untar(raw);
    assert.equal(entries[0]?.name, 'snapshot.json');
    const envelope = JSON.parse(entries[0]?.data.toString('utf8') ?? '') as {
      version: number;
      config: Record<string, unknown>;
    };
    assert.equal(envelope.version, 1);
    const original = await sim.json<SnapshotRecord>(['snapshot', 'inspect', 'vk-snap']);
    assert.equal(envelope.config.id, original.id);
    assert.equal(envelope.config.image_digest, original.image_digest);
    const cow = entries.find((e) => e.name === 'cow.raw');
    assert.ok(cow, 'the disk travels in the archive');
    assert.equal(cow.size, 0, 'an all-hole disk is sent as a sparse entry');
    assert.ok(Number(cow.pax?.['COCOON.sparse.size']) > 0);

    const imp = await sim.run(['snapshot', 'import', '--name', 'vk-snap-copy', '--description', 'copy'], {
      stdin: raw,
    });
    assert.equal(imp.code, 0, imp.stderr);
    const gz = await sim.run(['snapshot', 'import', '--name', 'vk-snap-gz'], { stdin: gzipSync(raw) });
    assert.equal(gz.code, 0, gz.stderr);
    for (const name of ['vk-snap-copy', 'vk-snap-gz']) {
      const got = await sim.json<SnapshotRecord>(['snapshot', 'inspect', name]);
      for (const k of [
        'image',
        'image_digest',
        'image_type',
        'hypervisor',
        'cpu',
        'memory',
        'storage',
        'nics',
      ] as const) {
        assert.deepEqual(got[k], original[k], `${name}.${k}`);
      }
    }
    assert.equal(
      (await sim.json<SnapshotRecord>(['snapshot', 'inspect', 'vk-snap-copy'])).description,
      'copy',
    );
    assert.equal(sim.calls().find((c) => c.argv.includes('vk-snap-copy'))?.stdinBytes, raw.length);
    const clone = await sim.json<VmRecord>([
      'vm',
      'clone',
      '--output',
      'json',
      '--name',
      'vk-from-import',
      'vk-snap-gz',
    ]);
    assert.equal(clone.state, 'running');
    const listed = await sim.json<SnapshotRecord[]>(['snapshot', 'list', '-o', 'json']);
    assert.deepEqual(listed.map((s) => s.name).sort(), ['base', 'vk-snap', 'vk-snap-copy', 'vk-snap-gz']);
  });

  test('import rejects other archive versions and archives without snapshot.json, leaving nothing', async () => {
    const v2 = await makeTar([
      { name: 'snapshot.json', data: JSON.stringify({ version: 2, config: { name: 'x' } }) },
    ]);
    const r = await sim.run(['snapshot', 'import', '--name', 'vk-v2'], { stdin: v2 });
    assert.deepEqual([r.code, r.stderr], [1, 'Error: unsupported snapshot archive version 2\n']);
    const none = await makeTar([{ name: 'cow.raw', data: 'x' }]);
    const r2 = await sim.run(['snapshot', 'import', '--name', 'vk-v2'], { stdin: none });
    assert.equal(r2.code, 1);
    assert.match(r2.stderr, /no snapshot\.json/);
    const ok = await makeTar([
      {
        name: 'snapshot.json',
        data: JSON.stringify({
          version: 1,
          config: { name: 'x', image: IMAGE, hypervisor: 'firecracker', nics: 1 },
        }),
      },
    ]);
    const r3 = await sim.run(['snapshot', 'import', '--name', 'vk-v2'], { stdin: ok });
    assert.equal(r3.code, 0, 'the name was left free by the failed imports');
    assert.equal(
      (await sim.json<SnapshotRecord>(['snapshot', 'inspect', 'vk-v2'])).hypervisor,
      'firecracker',
    );
  });
});
