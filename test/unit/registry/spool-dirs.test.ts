// Transfer directories named after their daemon, and the startup sweep of those whose daemon is
// gone (src/registry/spool-dirs.ts, docs/registry.md "Spool directories").
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { silentLogger } from '../../../src/log.ts';
import {
  ownerGone,
  ownSpoolOwner,
  parseSpoolName,
  spoolPrefix,
  statStartTime,
  sweepStaleSpoolDirs,
} from '../../../src/registry/spool-dirs.ts';

describe('statStartTime', () => {
  it('field 22, after a command holding spaces and parentheses', () => {
    const rest = Array.from({ length: 30 }, (_, i) => String(i + 3));
    assert.equal(statStartTime(`42 (a b) c)) ${rest.join(' ')}`), 22);
  });
  it('undefined when the text does not parse', () => {
    assert.equal(statStartTime('42 (x) S 1'), undefined);
  });
});

describe('spool names', () => {
  it('the prefix names the daemon: pid and start time', () => {
    assert.equal(spoolPrefix('push', { pid: 123, start: 4567 }), 'vk-push-123-4567-');
    assert.equal(spoolPrefix('pull', { pid: 9, start: 0 }), 'vk-pull-9-0-');
    const own = ownSpoolOwner();
    assert.equal(own.pid, process.pid);
    assert.ok(own.start > 0, 'this process has a start time in /proc');
  });

  it('parseSpoolName: mkdtemp names of the prefix; nothing else', () => {
    assert.deepEqual(parseSpoolName('vk-push-123-4567-aB3xYz'), { kind: 'push', pid: 123, start: 4567 });
    assert.deepEqual(parseSpoolName('vk-pull-1-0-000000'), { kind: 'pull', pid: 1, start: 0 });
    for (const name of [
      'vk-push-aB3xYz', // the older names: no owner to check
      'vk-push-123-4567-aB3xY', // five random characters
      'vk-push-123-4567-aB3xYz.tmp',
      'vk-spill-123-4567-aB3xYz',
      'vk-push-0-4567-aB3xYz',
      'vk-push--4567-aB3xYz',
      'x-vk-push-123-4567-aB3xYz',
    ])
      assert.equal(parseSpoolName(name), undefined, name);
  });

  it('ownerGone: a pid not running, or running a process started at another time', () => {
    assert.equal(ownerGone({ pid: 5, start: 100 }, undefined), true);
    assert.equal(ownerGone({ pid: 5, start: 100 }, 101), true);
    assert.equal(ownerGone({ pid: 5, start: 100 }, 100), false);
    assert.equal(ownerGone({ pid: 5, start: 0 }, undefined), false, 'no start recorded: never judged gone');
  });
});

describe('sweepStaleSpoolDirs', () => {
  let dir: string;
  let outside: string;
  before(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-sweep-test-'));
    outside = fs.mkdtempSync(path.join(os.tmpdir(), 'vk-sweep-outside-'));
  });
  after(() => {
    fs.rmSync(dir, { recursive: true, force: true });
    fs.rmSync(outside, { recursive: true, force: true });
  });

  it("removes the directories of a daemon that is gone; keeps a live daemon's, old names, files and symlinks", async () => {
    const own = ownSpoolOwner();
    // This pid with another start time: a daemon that had this pid before (gone).
    const gone = [`vk-push-${own.pid}-${own.start + 1}-aaaaaa`, `vk-pull-${own.pid}-${own.start + 7}-bbbbbb`];
    for (const name of gone) {
      fs.mkdirSync(path.join(dir, name, 'sub'), { recursive: true });
      fs.writeFileSync(path.join(dir, name, 'sub', 'layer'), 'spooled bytes');
    }
    const kept = {
      live: `${spoolPrefix('push', own)}cccccc`,
      noStart: `vk-pull-${own.pid}-0-dddddd`,
      oldName: 'vk-push-eeeeee',
      file: `vk-push-${own.pid}-${own.start + 2}-ffffff`,
      symlink: `vk-pull-${own.pid}-${own.start + 3}-gggggg`,
    };
    fs.mkdirSync(path.join(dir, kept.live));
    fs.mkdirSync(path.join(dir, kept.noStart));
    fs.mkdirSync(path.join(dir, kept.oldName));
    fs.writeFileSync(path.join(dir, kept.file), 'not a directory');
    fs.writeFileSync(path.join(outside, 'precious'), 'kept');
    fs.symlinkSync(outside, path.join(dir, kept.symlink));

    const removed = await sweepStaleSpoolDirs(dir, silentLogger);
    assert.deepEqual(removed.sort(), [...gone].sort());
    for (const name of gone) assert.equal(fs.existsSync(path.join(dir, name)), false, name);
    for (const name of Object.values(kept)) assert.ok(fs.lstatSync(path.join(dir, name)), name);
    assert.equal(
      fs.readFileSync(path.join(outside, 'precious'), 'utf8'),
      'kept',
      'nothing followed through the link',
    );
  });

  it("another user's directory, its daemon gone: kept", {
    skip: process.getuid?.() !== 0 && 'needs root to chown',
  }, async () => {
    const own = ownSpoolOwner();
    const name = `vk-push-${own.pid}-${own.start + 11}-hhhhhh`;
    fs.mkdirSync(path.join(dir, name));
    fs.chownSync(path.join(dir, name), 65534, 65534);
    assert.deepEqual(await sweepStaleSpoolDirs(dir, silentLogger), []);
    assert.ok(fs.existsSync(path.join(dir, name)));
  });

  it('a directory it cannot list: nothing removed, no throw', async () => {
    assert.deepEqual(await sweepStaleSpoolDirs(path.join(dir, 'missing'), silentLogger), []);
  });
});
