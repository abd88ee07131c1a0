// pushSnapshot's streamed uploads (docs/registry.md "Push flow"), with a scripted `cocoon
// snapshot export` (a shell script that cats a tar, with a pause part-way) and the in-process
// fake registry: a large file uploads as the export produces it, without a spool file; a file
// this process has seen in the repository is spooled and HEADed first and not uploaded again; an
// export that breaks mid-file, or an upload that fails mid-file, stops the other side and leaves
// no manifest and no spool file.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, beforeEach, describe, it } from 'node:test';
import tar from 'tar-stream';
import { CocoonCli } from '../../../src/cocoon/runner.ts';
import { silentLogger } from '../../../src/log.ts';
import { RegistryClient } from '../../../src/registry/client.ts';
import { pushSnapshot, SnapshotPushError } from '../../../src/registry/push.ts';
import { Fake, sha } from './fake-registry.ts';

const MiB = 1024 * 1024;

/** Whether process `pid` still exists (a reaped child does not). */
function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

describe('pushSnapshot: large files upload as they are exported', () => {
  const fake = new Fake();
  const lifetime = new AbortController();
  let dir: string;
  let cli: CocoonCli;
  let client: RegistryClient;
  const disk = randomBytes(3 * MiB + 12_345);
  const config = Buffer.from('{"vcpus":1}');

  before(async () => {
    await fake.start();
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-push-stream-'));
    // `snapshot export <name> -o -` (noting its pid): the first $<name>_SPLIT bytes of
    // <name>.tar, a pause (noting when it resumed), then the rest; with <name>.linger, it then
    // lingers that many seconds before it exits (noting when it would have).
    const shim = path.join(dir, 'cocoon');
    fs.writeFileSync(
      shim,
      [
        '#!/usr/bin/env bash',
        'set -e',
        '[ "$1" = snapshot ] && [ "$2" = export ] || exit 2',
        `echo $$ > "${dir}/$3.pid"`,
        `tarfile="${dir}/$3.tar"`,
        `split=$(cat "${dir}/$3.split")`,
        'head -c "$split" "$tarfile"',
        'sleep 0.4',
        `date +%s%3N > "${dir}/$3.resumed"`,
        'tail -c +$((split + 1)) "$tarfile"',
        `if [ -f "${dir}/$3.linger" ]; then sleep "$(cat "${dir}/$3.linger")"; fi`,
        `date +%s%3N > "${dir}/$3.exited"`,
        '',
      ].join('\n'),
      { mode: 0o755 },
    );
    cli = new CocoonCli(shim, lifetime.signal, silentLogger);
  });
  after(async () => {
    lifetime.abort();
    await fake.stop();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  beforeEach(() => {
    client?.close();
    fake.reset();
    client = new RegistryClient({ base: `${fake.host}/cocoon`, credentials: [] });
  });

  /** Writes `<name>.tar` (envelope, config.json, disk.raw) and where the export pauses. */
  async function exportTar(name: string, id: string, opts: { truncateAt?: number } = {}): Promise<void> {
    const pack = tar.pack();
    const envelope = JSON.stringify({ version: 1, config: { id, name, hypervisor: 'firecracker', cpu: 1 } });
    pack.entry({ name: 'snapshot.json', mode: 0o644 }, envelope);
    pack.entry({ name: 'config.json', mode: 0o640 }, config);
    pack.entry({ name: 'disk.raw', mode: 0o640 }, disk);
    pack.finalize();
    const chunks: Buffer[] = [];
    for await (const c of pack) chunks.push(c as Buffer);
    const all = Buffer.concat(chunks);
    fs.writeFileSync(
      path.join(dir, `${name}.tar`),
      opts.truncateAt === undefined ? all : all.subarray(0, opts.truncateAt),
    );
    // Pause with about 2.5 MiB of the disk out: two 1 MiB chunks can go up meanwhile.
    fs.writeFileSync(path.join(dir, `${name}.split`), String(all.length - disk.length + 2.5 * MiB));
  }

  const spool = () => fs.mkdtempSync(path.join(dir, 'spool-'));
  const push = (name: string, spoolDir: string) =>
    pushSnapshot({
      registry: client,
      cli,
      localName: name,
      repo: 'x',
      tag: 'latest',
      baseImage: '',
      chunkMiB: 1,
      streamMinMiB: 1,
      concurrency: 2,
      spoolDir,
    });
  const requests = () => fake.seen.map((s) => `${s.method} ${s.url.split('?')[0]}`);

  it('streams the large file: PATCHes go out while the export is still running; no spool file; manifest last', async () => {
    await exportTar('snap-a', 'AAAAAAAAAAAAAAAAAAAAAAAAA1');
    const dirA = spool();
    const r = await push('snap-a', dirA);
    const resumed = Number(fs.readFileSync(path.join(dir, 'snap-a.resumed'), 'utf8'));
    // One PATCH with the whole file, its first bytes sent before the export had finished.
    const patches = fake.seen.filter((s) => s.method === 'PATCH');
    assert.equal(patches.length, 1, requests().join('\n'));
    assert.equal(patches[0]!.headers['content-range'], `0-${disk.length - 1}`);
    assert.equal(patches[0]!.headers['content-length'], String(disk.length));
    assert.ok(
      patches[0]!.firstByteAt < resumed,
      `PATCH body started at ${patches[0]!.firstByteAt}, export resumed at ${resumed}: it must not wait for the end`,
    );
    assert.deepEqual(fake.blobs.get(sha(disk)), disk);
    assert.deepEqual(fake.blobs.get(sha(config)), config);
    assert.equal(requests().at(-1), 'PUT /v2/cocoon/x/manifests/latest');
    const manifest = JSON.parse(fake.manifests.get('latest')!.toString()) as {
      layers: { digest: string; size: number; annotations: Record<string, string> }[];
    };
    assert.deepEqual(
      manifest.layers.map((l) => [l.annotations['org.opencontainers.image.title'], l.digest, l.size]),
      [
        ['config.json', sha(config), config.length],
        ['disk.raw', sha(disk), disk.length],
      ],
    );
    assert.equal(r.uploadedBytes, r.bytes);
    assert.deepEqual(fs.readdirSync(dirA), [], 'spool directory removed');
  });

  it('a re-push: the file is known here, so it is spooled and HEADed first and nothing is uploaded', async () => {
    await exportTar('snap-a', 'AAAAAAAAAAAAAAAAAAAAAAAAA1');
    for (const [k, v] of [
      [sha(disk), disk],
      [sha(config), config],
    ] as const)
      fake.blobs.set(k, v);
    const r = await push('snap-a', spool());
    // The snapshot config blob is the only upload (the fake forgot it), no PATCH at all.
    assert.ok(r.uploadedBytes > 0 && r.uploadedBytes < 4096, `${r.uploadedBytes} uploaded`);
    assert.equal(requests().filter((x) => x.startsWith('POST ')).length, 1, requests().join('\n'));
    assert.ok(!requests().some((x) => x.startsWith('PATCH ')), requests().join('\n'));
    assert.ok(requests().includes(`HEAD /v2/cocoon/x/blobs/${sha(disk)}`), requests().join('\n'));
  });

  it('a large file of a snapshot not seen here streams even when the registry has it (no HEAD first)', async () => {
    await exportTar('snap-b', 'BBBBBBBBBBBBBBBBBBBBBBBBB2');
    fake.blobs.set(sha(disk), disk);
    fake.blobs.set(sha(config), config);
    const r = await push('snap-b', spool());
    assert.ok(!requests().includes(`HEAD /v2/cocoon/x/blobs/${sha(disk)}`), requests().join('\n'));
    assert.equal(requests().filter((x) => x.startsWith('PATCH ')).length, 1, requests().join('\n'));
    assert.ok(r.uploadedBytes >= disk.length, `${r.uploadedBytes} uploaded`);
    assert.deepEqual(fake.blobs.get(sha(disk)), disk);
    assert.equal(requests().at(-1), 'PUT /v2/cocoon/x/manifests/latest');
  });

  it('the export breaks in the middle of the streamed file: the push fails, no manifest, no blob, spool empty', async () => {
    await exportTar('snap-c', 'CCCCCCCCCCCCCCCCCCCCCCCCC3', { truncateAt: 3 * MiB });
    const dirC = spool();
    await assert.rejects(push('snap-c', dirC), (e: unknown) => {
      assert.ok(e instanceof SnapshotPushError, String(e));
      assert.equal(e.phase, 'export', e.message);
      return true;
    });
    assert.ok(!requests().some((x) => x.includes('/manifests/')), requests().join('\n'));
    assert.equal(fake.blobs.has(sha(disk)), false);
    assert.ok(
      requests().some((x) => x.startsWith('POST ')),
      'the upload had started before the export broke (its PATCH was cut, never complete)',
    );
    assert.deepEqual(fs.readdirSync(dirC), []);
  });

  it('the upload fails in the middle of the streamed file: the push fails (upload), the export is stopped, no manifest', async () => {
    await exportTar('snap-d', 'DDDDDDDDDDDDDDDDDDDDDDDDD4');
    // After its tar the export lingers 30 s before it exits 0: within the 60 s a push allows
    // an export to exit after its tar, so a push that waited for it would see it end by
    // itself; far beyond the milliseconds a push takes to stop it once the upload failed.
    fs.writeFileSync(path.join(dir, 'snap-d.linger'), '30');
    fake.patch416 = 1;
    const dirD = spool();
    await assert.rejects(push('snap-d', dirD), (e: unknown) => {
      assert.ok(e instanceof SnapshotPushError, String(e));
      assert.equal(e.phase, 'upload', e.message);
      assert.match(e.message, /layer disk\.raw \(streamed\): .*cannot start over/);
      return true;
    });
    // No wait for the export to end by itself: when the push rejects, the export was killed
    // (and reaped) before it got to its end.
    const pid = Number(fs.readFileSync(path.join(dir, 'snap-d.pid'), 'utf8'));
    assert.equal(alive(pid), false, 'the export was stopped');
    assert.equal(fs.existsSync(path.join(dir, 'snap-d.exited')), false, 'it did not run to its end');
    assert.ok(!requests().some((x) => x.includes('/manifests/')), requests().join('\n'));
    assert.equal(fake.blobs.has(sha(disk)), false);
    assert.deepEqual(fs.readdirSync(dirD), []);
  });
});
