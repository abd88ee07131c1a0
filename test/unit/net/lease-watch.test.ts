// The lease file's change notification (issue 9): a watch on the file's directory (the file is
// replaced by rename), one read per change shared by every waiter, a late directory, a failing
// watch, and nothing left watching once nobody listens. Outcomes only: every wait that must
// be woken by the watch uses a poll and a wait bound far beyond the test's own timeout, so a
// wake-up can only come from the watch (a broken watch fails the test by its timeout).
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { type LeaseSnapshot, resolveIp } from '../../../src/net/lease-parse.ts';
import { type DirWatcher, LeaseFile, type WatchDir } from '../../../src/net/leases.ts';

const NEVER = 3_600_000; // a poll / wait bound no test waits for
const T = { timeout: 20_000 };
const MAC = 'aa:19:42:20:d4:ba';
const vm = { nics: [{ mac: MAC }] };

function rows(ip: string): string {
  const expiry = new Date(Date.now() + 3_600_000).toISOString();
  return JSON.stringify([{ mac: MAC, ip, expiry }]);
}

/** cocoon-net's write: a temp file in the same directory renamed over the lease file. */
async function replaceByRename(path: string, text: string): Promise<void> {
  const tmp = `${path}.tmp-${process.hrtime.bigint()}`;
  await writeFile(tmp, text);
  await rename(tmp, path);
}

function ipOf(s: LeaseSnapshot): string {
  return resolveIp(vm, s, Date.now()).ip;
}

/** Counts the reads that go to the file. */
class CountingLeaseFile extends LeaseFile {
  reads = 0;
  override read(): Promise<LeaseSnapshot> {
    this.reads++;
    return super.read();
  }
}

/** Waits (no deadline of its own: the test's timeout bounds it) until `cond` holds. */
async function until(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 5));
}

describe('LeaseFile change notification', () => {
  let root = '';
  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'lease-watch-'));
  });
  after(async () => {
    await rm(root, { recursive: true, force: true });
  });

  it('a file replaced by rename wakes a waiter through the directory watch', T, async () => {
    const dir = await mkdtemp(join(root, 'a-'));
    const path = join(dir, 'leases.json');
    await replaceByRename(path, '[]');
    const file = new LeaseFile(path, { pollMs: NEVER });
    using wait = file.subscribe();
    assert.equal(ipOf(await wait.snapshot()), '');
    assert.ok(file.watching, 'the directory is watched while someone waits');
    // Twice: the second replacement proves the watch survived the first rename (a watch on
    // the file's inode would have died with it).
    for (const ip of ['10.0.0.7', '10.0.0.8']) {
      await replaceByRename(path, rows(ip));
      let seen = '';
      while (seen !== ip) {
        await wait.wait(NEVER);
        seen = ipOf(await wait.snapshot());
      }
      assert.equal(seen, ip);
    }
    file.close();
  });

  it('a change between a snapshot and the next wait is not lost', T, async () => {
    const dir = await mkdtemp(join(root, 'b-'));
    const path = join(dir, 'leases.json');
    const file = new LeaseFile(path, { pollMs: NEVER });
    using wait = file.subscribe();
    assert.equal(ipOf(await wait.snapshot()), '');
    await replaceByRename(path, rows('10.0.0.9'));
    await until(() => file.current !== undefined && ipOf(file.current) === '10.0.0.9');
    // The change arrived before this wait started: it returns at once.
    await wait.wait(NEVER);
    assert.equal(ipOf(await wait.snapshot()), '10.0.0.9');
    file.close();
  });

  it('many waiters share one read per change', T, async () => {
    const dir = await mkdtemp(join(root, 'c-'));
    const path = join(dir, 'leases.json');
    const file = new CountingLeaseFile(path, { pollMs: NEVER });
    const waiters = Array.from({ length: 50 }, () => file.subscribe());
    for (const w of waiters) assert.equal(ipOf(await w.snapshot()), '');
    await until(() => file.current !== undefined); // the watch's first read is done
    const readsBefore = file.reads;
    await replaceByRename(path, rows('10.0.0.10'));
    const seen = await Promise.all(
      waiters.map(async (w) => {
        let ip = '';
        while (ip === '') {
          await w.wait(NEVER);
          ip = ipOf(await w.snapshot());
        }
        return ip;
      }),
    );
    assert.deepEqual(new Set(seen), new Set(['10.0.0.10']));
    const reads = file.reads - readsBefore;
    assert.ok(reads >= 1 && reads <= 2, `one read per change for 50 waiters, got ${reads}`);
    for (const w of waiters) w.close();
    assert.equal(file.watching, false, 'the last waiter gone: no watch');
    file.close();
  });

  it('a directory created late is picked up by the poll, then watched', T, async () => {
    const dir = join(root, 'late', 'net');
    const path = join(dir, 'leases.json');
    const file = new LeaseFile(path, { pollMs: 20 });
    using wait = file.subscribe();
    assert.equal(ipOf(await wait.snapshot()), '', 'no directory: no lease');
    assert.equal(file.watching, false);
    await mkdir(dir, { recursive: true });
    await until(() => file.watching);
    await replaceByRename(path, rows('10.0.0.11'));
    let ip = '';
    while (ip === '') {
      await wait.wait(NEVER);
      ip = ipOf(await wait.snapshot());
    }
    assert.equal(ip, '10.0.0.11');
    file.close();
    assert.equal(file.watching, false);
  });

  it('a failing watch falls back to polling, logged once; the poll re-establishes it', T, async () => {
    const dir = await mkdtemp(join(root, 'd-'));
    const path = join(dir, 'leases.json');
    const watchers: (EventEmitter & DirWatcher & { closed: boolean })[] = [];
    const watchDir: WatchDir = () => {
      const w = Object.assign(new EventEmitter(), {
        closed: false,
        close() {
          w.closed = true;
        },
      });
      watchers.push(w);
      return w;
    };
    const warnings: string[] = [];
    const log = {
      child: () => log,
      info: () => {},
      warn: (_f: unknown, msg: string) => void warnings.push(msg),
    } as unknown as import('../../../src/log.ts').Logger;
    const file = new LeaseFile(path, { pollMs: 20, watchDir, log });
    using wait = file.subscribe();
    assert.equal(ipOf(await wait.snapshot()), '');
    assert.equal(watchers.length, 1);
    watchers[0]!.emit('error', new Error('inotify broke'));
    assert.equal(watchers[0]!.closed, true, 'the failed watcher is closed');
    // The fake watch never reports an event: only the poll can see this change.
    await writeFile(path, rows('10.0.0.12'));
    let ip = '';
    while (ip === '') {
      await wait.wait(NEVER);
      ip = ipOf(await wait.snapshot());
    }
    assert.equal(ip, '10.0.0.12');
    await until(() => watchers.length >= 2); // a poll tick re-established the watch
    watchers.at(-1)!.emit('error', new Error('inotify broke again'));
    assert.deepEqual(warnings, ['cannot watch the lease file directory; polling instead']);
    file.close();
    assert.ok(
      watchers.every((w) => w.closed),
      'every watcher is closed',
    );
  });

  it('no watcher outlives its listeners or close(); a closed file delivers nothing', T, async () => {
    const dir = await mkdtemp(join(root, 'e-'));
    const path = join(dir, 'leases.json');
    let open = 0;
    const watchDir: WatchDir = () => {
      open++;
      const w = Object.assign(new EventEmitter(), { close: () => void open-- });
      return w;
    };
    const file = new LeaseFile(path, { pollMs: NEVER, watchDir });
    const a = file.subscribe();
    const b = file.subscribe();
    assert.equal(open, 1, 'one watch for every listener');
    a.close();
    assert.equal(open, 1);
    b.close();
    assert.equal(open, 0, 'the last listener gone: the watch is closed');
    const c = file.subscribe();
    assert.equal(open, 1);
    // A wait in progress is released by close() of its subscription (never hangs a job).
    const pending = c.wait(NEVER);
    file.close();
    assert.equal(open, 0, 'close() stops watching');
    c.close();
    await pending;
    const delivered: LeaseSnapshot[] = [];
    file.onChange((s) => void delivered.push(s));
    assert.equal(open, 0, 'nothing is watched after close()');
    assert.deepEqual(delivered, []);
  });

  it('an aborted wait returns at once', T, async () => {
    const file = new LeaseFile(join(root, 'f', 'leases.json'), { pollMs: NEVER });
    using wait = file.subscribe();
    const ac = new AbortController();
    const pending = wait.wait(NEVER, ac.signal);
    ac.abort();
    await pending;
    await wait.wait(NEVER, ac.signal); // already aborted
    file.close();
  });
});
