// LeaseFile.read(): the cached snapshot is checked with a stat of the path; whatever the stat
// does not vouch for (another inode, a missing file, a directory) is read through a handle,
// one such read at a time, shared by the callers that came while it ran.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { mkdir, mkdtemp, rename, rm, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { LeaseFile } from '../../../src/net/leases.ts';

const row = (ip: string) =>
  JSON.stringify([{ mac: 'aa:19:42:20:d4:ba', ip, expiry: '2026-08-12T09:30:00Z' }]);
const MTIME = new Date('2026-08-01T00:00:00Z');

describe('LeaseFile.read() cache check', () => {
  let dir = '';
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'lease-cache-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('an unchanged file is served from the cache, many times', async () => {
    const path = join(dir, 'same.json');
    await writeFile(path, row('172.24.1.1'));
    const file = new LeaseFile(path);
    const first = await file.read();
    for (let i = 0; i < 50; i++) assert.equal(await file.read(), first);
  });

  it('a file renamed into place (new inode, same size and mtime) is read again', async () => {
    const path = join(dir, 'renamed.json');
    await writeFile(path, row('172.24.1.161'));
    await utimes(path, MTIME, MTIME);
    const file = new LeaseFile(path);
    const first = await file.read();
    assert.ok(first.ok);
    assert.equal(first.leases[0]?.ip, '172.24.1.161');

    // cocoon-net's write-temp-then-rename, same length and the same mtime
    const tmp = join(dir, 'renamed.json.tmp');
    await writeFile(tmp, row('172.24.1.162'));
    await utimes(tmp, MTIME, MTIME);
    await rename(tmp, path);
    const next = await file.read();
    assert.ok(next.ok);
    assert.equal(next.leases[0]?.ip, '172.24.1.162');
  });

  it('a cached file that disappears is "no lease", and one that comes back is read', async () => {
    const path = join(dir, 'gone.json');
    await writeFile(path, row('172.24.1.5'));
    const file = new LeaseFile(path);
    assert.equal((await file.read()).ok, true);
    await rm(path);
    assert.deepEqual(await file.read(), { ok: true, leases: [] });
    await writeFile(path, row('172.24.1.6'));
    const back = await file.read();
    assert.ok(back.ok);
    assert.equal(back.leases[0]?.ip, '172.24.1.6');
  });

  it('a directory in place of a cached file is a read error', async () => {
    const path = join(dir, 'replaced.json');
    await writeFile(path, row('172.24.1.7'));
    const file = new LeaseFile(path);
    assert.equal((await file.read()).ok, true);
    await rm(path);
    await mkdir(path);
    assert.equal((await file.read()).ok, false);
  });

  it('concurrent reads after a change share one read of the file', async () => {
    const path = join(dir, 'shared.json');
    await writeFile(path, row('172.24.2.1'));
    const file = new LeaseFile(path);
    await file.read();
    await writeFile(path, row('172.24.2.22'));
    const all = await Promise.all(Array.from({ length: 20 }, () => file.read()));
    assert.ok(all[0]?.ok);
    assert.equal(all[0].leases[0]?.ip, '172.24.2.22');
    for (const s of all) assert.equal(s, all[0], 'one snapshot for every caller');
  });

  it('a change made while a read runs is seen by a read that starts after it', async () => {
    const path = join(dir, 'during.json');
    await writeFile(path, row('172.24.3.1'));
    const file = new LeaseFile(path);
    for (let i = 0; i < 20; i++) {
      const ip = `172.24.3.${100 + i}`;
      writeFileSync(path, row(`172.24.4.${100 + i}`));
      const before = file.read(); // a handle read, still running below
      writeFileSync(path, row(ip));
      const after = await file.read();
      await before;
      assert.ok(after.ok);
      assert.equal(after.leases[0]?.ip, ip);
    }
  });
});
