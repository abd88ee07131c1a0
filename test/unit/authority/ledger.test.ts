// The provenance ledger file (src/authority/ledger.ts): durable, 0600, intent then confirm,
// reconciled against what cocoon lists, a corrupt file refused.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, it } from 'node:test';
import { Ledger, LedgerError } from '../../../src/authority/ledger.ts';
import type { VmRecord } from '../../../src/cocoon/records.ts';
import { silentLogger } from '../../../src/log.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('authority/ledger', () => {
  const A = { namespace: 'a', vmName: 'vk-a', controllerUid: '' };
  const B = { namespace: 'b', vmName: 'vk-a', controllerUid: '' };
  const pod = { key: 'a/p', uid: 'u1' };
  const dirs: string[] = [];
  const fresh = () => {
    const d = mkdtempSync(join(tmpdir(), 'vk-ledger-'));
    dirs.push(d);
    return join(d, 'state', 'ledger.json');
  };
  const open = (path: string) => Ledger.open({ path, node: 'n', log: silentLogger });
  const vm = (name: string, id: string, createdAt: string) =>
    ({ name, id, createdAt }) as unknown as VmRecord;
  afterEach(() => {
    for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
  });

  describe('Ledger', () => {
    it('a first start creates the file 0600; a second open reads it back', async () => {
      const path = fresh();
      const l = await open(path);
      assert.equal(l.firstStart, true);
      await l.intend('vm', 'vk-a', A, pod);
      await l.confirm('vm', 'vk-a', 'ID1', A, pod);
      assert.equal(statSync(path).mode & 0o777, 0o600);
      const again = await open(path);
      assert.equal(again.firstStart, false);
      assert.equal(again.vm('vk-a')?.id, 'ID1');
      assert.equal(again.vm('vk-a')?.pod, 'a/p');
      assert.equal(again.vmById('ID1')?.name, 'vk-a');
    });

    it('concurrent writes all land (group commit)', async () => {
      const path = fresh();
      const l = await open(path);
      await Promise.all(
        Array.from({ length: 50 }, (_, i) => l.intend('vm', `vk-${i}`, { ...A, vmName: `vk-${i}` }, pod)),
      );
      const again = await open(path);
      assert.equal(again.size().vms, 50);
    });

    it('never re-labels another identity`s entry', async () => {
      const l = await open(fresh());
      await l.intend('vm', 'vk-a', A, pod);
      await assert.rejects(l.intend('vm', 'vk-a', B, pod), LedgerError);
      assert.equal(l.vm('vk-a')?.owner.namespace, 'a');
    });

    it('a repeated intent keeps its first time; a re-make of a confirmed entry records intentAt', async () => {
      const l = await open(fresh());
      await l.intend('vm', 'vk-a', A, pod);
      const first = l.vm('vk-a')?.at;
      await new Promise((r) => setImmediate(r));
      await l.intend('vm', 'vk-a', A, pod);
      assert.equal(l.vm('vk-a')?.at, first);
      await l.confirm('vm', 'vk-a', 'ID1', A, pod);
      await l.intend('vm', 'vk-a', A, pod);
      assert.equal(l.vm('vk-a')?.id, 'ID1');
      assert.ok(l.vm('vk-a')?.intentAt);
    });

    it('reconcile: an intent with its VM made after it is confirmed; one with an older VM, or none, is dropped; a confirmed entry whose VM is gone is dropped', async () => {
      const l = await open(fresh());
      await l.intend('vm', 'vk-made', { ...A, vmName: 'vk-made' }, pod);
      await l.intend('vm', 'vk-older', { ...A, vmName: 'vk-older' }, pod);
      await l.intend('vm', 'vk-never', { ...A, vmName: 'vk-never' }, pod);
      await l.confirm('vm', 'vk-gone', 'IDG', { ...A, vmName: 'vk-gone' }, pod);
      await l.setRestore('vk-gone', 'IDG');
      const later = new Date(Date.now() + 1000).toISOString();
      const r = await l.reconcile(
        [vm('vk-made', 'IDM', later), vm('vk-older', 'IDO', '2020-01-01T00:00:00Z')],
        [],
      );
      assert.deepEqual(r, { confirmed: 1, dropped: 3 });
      assert.equal(l.vm('vk-made')?.id, 'IDM');
      assert.equal(l.vm('vk-made')?.state, 'confirmed');
      assert.equal(l.vm('vk-older'), undefined);
      assert.equal(l.vm('vk-never'), undefined);
      assert.equal(l.vm('vk-gone'), undefined);
      assert.equal(l.restoreFlag('vk-gone'), false);
    });

    it('the restore flag survives a reopen (a SIGKILL during a CH+Windows wake)', async () => {
      const path = fresh();
      const l = await open(path);
      await l.confirm('vm', 'vk-win', 'IDW', { ...A, vmName: 'vk-win' }, pod);
      await l.setRestore('vk-win', 'IDW');
      assert.equal((await open(path)).restoreFlag('vk-win'), true);
    });

    it('a file that does not decode stops the open, naming the path', async () => {
      const path = fresh();
      await open(path);
      writeFileSync(path, '{"version":1,"node":"n","vms":{"x":{"name":1}}}');
      await assert.rejects(
        open(path),
        (err: Error) => err instanceof LedgerError && err.message.includes(path),
      );
      writeFileSync(path, 'not json');
      await assert.rejects(open(path), /is not JSON/);
      assert.equal(readFileSync(path, 'utf8'), 'not json', 'never overwritten');
    });

    it('a deferred push is durable, counts its failed tries, and is dropped with its local snapshot', async () => {
      const path = fresh();
      const l = await open(path);
      const push = {
        name: 'vk-a',
        repo: 'vk-a',
        tag: 'latest',
        snapshotId: 'S1',
        baseImage: 'acme/agent',
        owner: A,
        pod: 'a/p',
        podUid: 'u1',
        savedAt: '2026-12-01T10:00:00.000Z',
        keep: false,
        lastError: 'push vk-a:latest: connect ECONNREFUSED',
      };
      await l.deferPush(push);
      await l.pushFailed('vk-a', 'still down');
      const again = await open(path);
      assert.deepEqual(
        again.pendingPushes().map((p) => [p.name, p.attempts, p.lastError, p.owner.namespace]),
        [['vk-a', 1, 'still down', 'a']],
      );
      assert.equal(again.size().pushes, 1);
      // Startup: kept while its local snapshot is listed, dropped once it is gone.
      await again.reconcile([], [{ name: 'vk-a', id: 'S1' } as never]);
      assert.equal(again.pendingPush('vk-a')?.attempts, 1);
      await again.reconcile([], undefined);
      assert.equal(again.size().pushes, 1, 'a failed snapshot list keeps it');
      await again.reconcile([], []);
      assert.equal(again.pendingPush('vk-a'), undefined);
      await again.deferPush(push);
      await again.endPush('vk-a');
      assert.equal((await open(path)).size().pushes, 0);
    });

    it('a file written before deferred pushes existed reads as none pending', async () => {
      const path = fresh();
      const l = await open(path);
      await l.intend('vm', 'vk-a', A, pod);
      const doc = JSON.parse(readFileSync(path, 'utf8')) as Record<string, unknown>;
      delete doc.pushes;
      writeFileSync(path, JSON.stringify(doc));
      assert.deepEqual((await open(path)).pendingPushes(), []);
    });
  });
});
