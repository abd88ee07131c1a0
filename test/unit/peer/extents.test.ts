// Data extents of stored snapshot files (shared/spec/peer-restore.md §4 "Extents"): the
// SEEK_DATA walk through perl, the read scan, their shortcuts and the plan cache.
import assert from 'node:assert/strict';
import {
  closeSync,
  promises as fsp,
  openSync,
  statfsSync,
  utimesSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { after, describe, it } from 'node:test';
import { planFile, planSnapshotFiles, type ScanMethod, scanExtents } from '../../../src/peer/extents.ts';
import { MiB } from '../../../src/peer/wire.ts';
import { tempDir, writeSparse, writeSpecSparse } from './helpers.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('peer/extents', () => {
  const tmp = tempDir();
  after(() => tmp.cleanup());

  /** Scans `path` through a FileHandle whose reads are counted. */
  async function scan(path: string, method?: ScanMethod): Promise<{ extents: unknown; reads: number }> {
    const fh = await fsp.open(path, 'r');
    let reads = 0;
    const counting = new Proxy(fh, {
      get(target, prop) {
        if (prop === 'read') {
          return (...args: Parameters<typeof fh.read>) => {
            reads++;
            return target.read(...args);
          };
        }
        const v = Reflect.get(target, prop);
        return typeof v === 'function' ? v.bind(target) : v;
      },
    });
    try {
      return { extents: await scanExtents(path, counting, await fh.stat(), method), reads };
    } finally {
      await fh.close();
    }
  }

  const exactBlocks = [0xef53, 0x01021994, 0x58465342, 0x794c7630].includes(Number(statfsSync(tmp.dir).type));

  describe('scanExtents', () => {
    const spec = join(tmp.dir, 'spec.qcow2');
    writeSpecSparse(spec);

    it('walks SEEK_DATA/SEEK_HOLE as Go does', async () => {
      const { extents } = await scan(spec, 'seek');
      assert.deepEqual(extents, [
        { offset: 0, length: 4096 },
        { offset: 3 * MiB, length: 32 * 1024 },
      ]);
    });

    it('without perl, finds the non-zero 1 MiB blocks by reading', async () => {
      const { extents } = await scan(spec, 'read');
      assert.deepEqual(extents, [
        { offset: 0, length: MiB },
        { offset: 3 * MiB, length: MiB },
      ]);
    });

    it('finds nothing in an empty or an all-hole file, and reads neither', async () => {
      const empty = join(tmp.dir, 'empty');
      writeFileSync(empty, '');
      const holes = join(tmp.dir, 'holes');
      writeSparse(holes, 8 * MiB, []);
      for (const method of ['seek', 'read'] as const) {
        assert.deepEqual(await scan(empty, method), { extents: [], reads: 0 });
        assert.deepEqual(await scan(holes, method), { extents: [], reads: 0 });
      }
    });

    it('the read scan takes a fully allocated file as one extent without reading it', async () => {
      const dense = join(tmp.dir, 'dense');
      writeFileSync(dense, Buffer.alloc(2 * MiB + 5, 7));
      assert.deepEqual(await scan(dense, 'read'), {
        extents: [{ offset: 0, length: 2 * MiB + 5 }],
        reads: 0,
      });
    });

    it('the read scan stops once the allocated blocks are accounted for', {
      skip: !exactBlocks,
    }, async () => {
      const big = join(tmp.dir, 'marker-at-start');
      writeSparse(big, 64 * MiB, [[0, Buffer.alloc(4096, 1)]]);
      assert.deepEqual(await scan(big, 'read'), { extents: [{ offset: 0, length: MiB }], reads: 1 });
    });
  });

  describe('planFile and planSnapshotFiles', () => {
    it('coalesces the §8 sparse file into the spec example slice', async () => {
      writeSpecSparse(join(tmp.dir, 'overlay.qcow2'));
      assert.deepEqual(await planFile(tmp.dir, 'overlay.qcow2', 'seek'), {
        name: 'overlay.qcow2',
        size: 4 * MiB,
        slices: [{ offset: 0, length: 3178496 }],
      });
    });

    it('keeps extents more than 4 MiB apart as separate slices', async () => {
      const far = join(tmp.dir, 'far');
      writeSparse(far, 600 * MiB, [
        [0, Buffer.alloc(10, 1)],
        [40 * MiB, Buffer.alloc(10, 1)],
        [100 * MiB, Buffer.alloc(MiB, 1)],
        [500 * MiB, Buffer.alloc(MiB, 1)],
      ]);
      const plan = await planFile(tmp.dir, 'far', 'seek');
      assert.deepEqual(plan.slices, [
        { offset: 0, length: 4096 },
        { offset: 40 * MiB, length: 4096 },
        { offset: 100 * MiB, length: MiB },
        { offset: 500 * MiB, length: MiB },
      ]);
    });

    it('answers an unchanged file (path, size, mtime, inode) from the cache', async () => {
      const path = join(tmp.dir, 'cached');
      writeSparse(path, 16 * MiB, [[0, Buffer.alloc(10, 1)]]);
      const mtime = new Date(1_700_000_000_000); // whole seconds: utimes keeps it exactly
      const atime = mtime;
      utimesSync(path, atime, mtime);
      const first = await planFile(tmp.dir, 'cached', 'seek');
      const fd = openSync(path, 'r+');
      writeSync(fd, Buffer.alloc(10, 1), 0, 10, 12 * MiB);
      closeSync(fd);
      utimesSync(path, atime, mtime);
      assert.deepEqual(await planFile(tmp.dir, 'cached', 'seek'), first, 'same key: the cached plan');
      utimesSync(path, atime, new Date(mtime.getTime() + 1000));
      const fresh = await planFile(tmp.dir, 'cached', 'seek');
      assert.equal(fresh.slices?.length, 2, 'a new mtime: scanned again');
    });

    it('refuses an ID that is not plain and a missing directory, naming no path', async () => {
      await assert.rejects(planSnapshotFiles(tmp.dir, '..'), { message: 'snapshot id is not a plain name' });
      await assert.rejects(planSnapshotFiles(tmp.dir, 'missing'), {
        message: 'snapshot directory cannot be read',
      });
    });
  });
});
