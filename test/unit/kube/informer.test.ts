// The informer of the hand-written client (src/kube/informer.ts) against a local watch server:
// list then watch from the list's resourceVersion, the watch line parser, relist on 410
// (at connect and as an ERROR event) with deletes for what disappeared, re-open from the last
// resourceVersion when a stream ends, backoff on failures, and the line-length bound.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ApiError } from '../../../src/kube/client.ts';
import { Informer, type KubeObject, LineSplitter, LineTooLongError } from '../../../src/kube/informer.ts';
import { RestClient } from '../../../src/kube/rest.ts';
import { type FakeWatchServer, fakeKubeConfig, startFakeWatchServer } from '../fakes/kube.ts';

const PATH = '/api/v1/pods';

test('LineSplitter: lines across chunks, several per chunk, and the length bound', () => {
  const s = new LineSplitter(10);
  assert.deepEqual(s.push(Buffer.from('ab')), []);
  assert.deepEqual(
    s.push(Buffer.from('c\nde\nf')).map((b) => b.toString()),
    ['abc', 'de'],
  );
  assert.deepEqual(
    s.push(Buffer.from('\n')).map((b) => b.toString()),
    ['f'],
  );
  assert.deepEqual(
    s.push(Buffer.from('\n\n')).map((b) => b.toString()),
    ['', ''],
  );
  // A multi-byte character split between chunks is joined before decoding.
  const euro = Buffer.from('€\n');
  assert.deepEqual(s.push(euro.subarray(0, 2)), []);
  assert.deepEqual(
    s.push(euro.subarray(2)).map((b) => b.toString()),
    ['€'],
  );
  // 10 bytes fit; 11 do not, whether the line ends in the chunk or not.
  assert.deepEqual(
    s.push(Buffer.from('0123456789\n')).map((b) => b.toString()),
    ['0123456789'],
  );
  assert.throws(() => s.push(Buffer.from('0123456789A\n')), LineTooLongError);
  s.push(Buffer.from('012345'));
  assert.throws(() => s.push(Buffer.from('6789AB')), LineTooLongError);
  // After the error it starts over.
  assert.deepEqual(
    s.push(Buffer.from('ok\n')).map((b) => b.toString()),
    ['ok'],
  );
});

interface Obj extends KubeObject {
  data?: string;
}

function obj(name: string, rv: string, data?: string): Obj {
  return { metadata: { namespace: 'ns', name, resourceVersion: rv }, ...(data ? { data } : {}) };
}

async function until(what: string, check: () => boolean, timeoutMs = 5000): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!check()) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

interface Rig {
  ws: FakeWatchServer;
  informer: Informer<Obj>;
  lists: number;
  /** What the next list answers. */
  answer: { items: Obj[]; rv: string };
  seen: string[];
  errors: unknown[];
}

async function rig(
  t: { after: (fn: () => Promise<void>) => void },
  opts: { maxLineBytes?: number; baseBackoffMs?: number; maxBackoffMs?: number } = {},
) {
  const ws = await startFakeWatchServer();
  const rest = new RestClient(fakeKubeConfig(ws.url));
  const r: Rig = {
    ws,
    lists: 0,
    answer: { items: [], rv: '10' },
    seen: [],
    errors: [],
    informer: undefined as unknown as Informer<Obj>,
  };
  r.informer = new Informer<Obj>({
    rest,
    path: PATH,
    list: async () => {
      r.lists++;
      return { items: structuredClone(r.answer.items), metadata: { resourceVersion: r.answer.rv } };
    },
    fieldSelector: 'spec.nodeName=n1',
    baseBackoffMs: 20,
    maxBackoffMs: 80,
    watchTimeoutSeconds: () => 321,
    ...opts,
  });
  for (const verb of ['add', 'update', 'delete'] as const)
    r.informer.on(verb, (o) => r.seen.push(`${verb} ${o.metadata?.name}@${o.metadata?.resourceVersion}`));
  r.informer.on('error', (err) => r.errors.push(err));
  t.after(async () => {
    await r.informer.stop();
    rest.close();
    await ws.close();
  });
  return r;
}

const lastWatch = (r: Rig) => r.ws.requests.at(-1) as URL;

test('lists, then watches from the list resourceVersion with bookmarks, the selector and a server timeout', async (t) => {
  const r = await rig(t);
  r.answer = { items: [obj('a', '5'), obj('b', '6')], rv: '10' };
  await r.informer.start();
  assert.equal(r.informer.synced, true);
  assert.deepEqual(r.seen, ['add a@5', 'add b@6']);
  assert.deepEqual(
    r.informer
      .list()
      .map((o) => o.metadata?.name)
      .sort(),
    ['a', 'b'],
  );
  assert.equal(r.informer.get('a', 'ns')?.metadata?.resourceVersion, '5');
  assert.equal(r.informer.get('a'), undefined, 'namespace is part of the key');
  await r.ws.waitForWatch(PATH);
  const q = lastWatch(r).searchParams;
  assert.equal(q.get('watch'), 'true');
  assert.equal(q.get('resourceVersion'), '10');
  assert.equal(q.get('allowWatchBookmarks'), 'true');
  assert.equal(q.get('fieldSelector'), 'spec.nodeName=n1');
  assert.equal(q.get('timeoutSeconds'), '321');

  // Events: add, update (only when the resourceVersion moved), delete; the objects are the
  // JSON as sent (timestamps stay strings).
  r.ws.emit(PATH, 'ADDED', {
    ...obj('c', '11'),
    metadata: { ...obj('c', '11').metadata, creationTimestamp: '2026-01-01T00:00:00Z' },
  });
  r.ws.emit(PATH, 'MODIFIED', obj('a', '12', 'x'));
  r.ws.emit(PATH, 'MODIFIED', obj('a', '12', 'same version'));
  r.ws.emit(PATH, 'DELETED', obj('b', '13'));
  r.ws.emit(PATH, 'DELETED', obj('zz', '14')); // unknown: no callback
  await until('events', () => r.seen.length === 5);
  assert.deepEqual(r.seen.slice(2), ['add c@11', 'update a@12', 'delete b@13']);
  assert.equal(r.informer.get('a', 'ns')?.data, 'x');
  const c = r.informer.get('c', 'ns') as { metadata: { creationTimestamp: unknown } };
  assert.equal(typeof c.metadata.creationTimestamp, 'string');
  await until('rv 14', () => r.informer.latestResourceVersion() === '14');

  // A bookmark moves the resourceVersion without a callback.
  r.ws.emit(PATH, 'BOOKMARK', { metadata: { resourceVersion: '40' } });
  await until('rv 40', () => r.informer.latestResourceVersion() === '40');
  assert.equal(r.seen.length, 5);
  assert.equal(r.lists, 1);
  assert.deepEqual(r.errors, []);
});

test('a stream the server ends is re-opened from the last resourceVersion, without a list', async (t) => {
  const r = await rig(t);
  await r.informer.start();
  await r.ws.waitForWatch(PATH);
  r.ws.emit(PATH, 'ADDED', obj('a', '21'));
  await until('a', () => r.seen.length === 1);
  r.ws.end(PATH);
  await until('second watch', () => r.ws.requests.length === 2);
  assert.equal(lastWatch(r).searchParams.get('resourceVersion'), '21');
  assert.equal(r.lists, 1);
  assert.deepEqual(r.errors, []);
  await r.ws.waitForWatch(PATH);
  r.ws.emit(PATH, 'MODIFIED', obj('a', '22'));
  await until('update', () => r.seen.length === 2);
  assert.deepEqual(r.seen, ['add a@21', 'update a@22']);
});

test('an ERROR event with 410 Gone relists; objects missing from the new list are deleted', async (t) => {
  const r = await rig(t);
  r.answer = { items: [obj('a', '5'), obj('b', '6')], rv: '10' };
  await r.informer.start();
  await r.ws.waitForWatch(PATH);
  r.answer = { items: [obj('a', '5'), obj('c', '30')], rv: '31' };
  r.ws.emit(PATH, 'ERROR', {
    kind: 'Status',
    apiVersion: 'v1',
    status: 'Failure',
    message: 'too old resource version: 10 (25)',
    reason: 'Expired',
    code: 410,
  });
  await until('relist', () => r.lists === 2);
  await until('watch after relist', () => r.ws.requests.length === 2);
  assert.deepEqual(r.seen, ['add a@5', 'add b@6', 'delete b@6', 'add c@30']);
  assert.equal(lastWatch(r).searchParams.get('resourceVersion'), '31');
  assert.deepEqual(r.errors, [], '410 is routine, not an error');
});

test('410 Gone at connect relists at once, without a backoff', async (t) => {
  // Any backoff would be an hour: only a relist that does not wait for one can be seen.
  const r = await rig(t, { baseBackoffMs: 3_600_000, maxBackoffMs: 3_600_000 });
  r.answer = { items: [obj('a', '5')], rv: '10' };
  r.ws.rejectNext(PATH, 410, 'too old resource version');
  await r.informer.start();
  await until('relist', () => r.lists === 2);
  await r.ws.waitForWatch(PATH);
  assert.deepEqual(r.errors, []);
  assert.equal(r.ws.requests.length, 2);
});

test('other ERROR events relist and are reported', async (t) => {
  const r = await rig(t);
  r.answer = { items: [obj('a', '5')], rv: '10' };
  await r.informer.start();
  await r.ws.waitForWatch(PATH);
  r.ws.emit(PATH, 'ERROR', { kind: 'Status', status: 'Failure', message: 'etcd hiccup', code: 500 });
  await until('relist', () => r.lists === 2);
  assert.equal(r.errors.length, 1);
  const err: unknown = r.errors[0];
  assert.ok(err instanceof ApiError);
  assert.equal(err.code, 500);
  assert.match(err.message, /etcd hiccup/);
});

test('a failing watch is retried with backoff from the same resourceVersion and reported', async (t) => {
  const r = await rig(t);
  await r.informer.start();
  await r.ws.waitForWatch(PATH);
  r.ws.emit(PATH, 'ADDED', obj('a', '50'));
  await until('a', () => r.seen.length === 1);
  r.ws.rejectNext(PATH, 500, 'boom');
  r.ws.rejectNext(PATH, 403, 'forbidden');
  r.ws.end(PATH);
  await until('third watch', () => r.ws.open(PATH) === 1 && r.ws.requests.length === 4);
  assert.deepEqual(
    r.errors.map((e) => (e as ApiError).code),
    [500, 403],
  );
  for (const u of r.ws.requests.slice(1)) assert.equal(u.searchParams.get('resourceVersion'), '50');
  assert.equal(r.lists, 1);
});

test('a failing list is retried with backoff; start() resolves once a list succeeds', async (t) => {
  const ws = await startFakeWatchServer();
  const rest = new RestClient(fakeKubeConfig(ws.url));
  let n = 0;
  const errors: unknown[] = [];
  const informer = new Informer<Obj>({
    rest,
    path: PATH,
    list: async () => {
      if (++n < 3) throw new ApiError(503, { message: 'not yet' });
      return { items: [obj('a', '1')], metadata: { resourceVersion: '2' } };
    },
    baseBackoffMs: 10,
  });
  informer.on('error', (e) => errors.push(e));
  t.after(async () => {
    await informer.stop();
    rest.close();
    await ws.close();
  });
  await informer.start();
  assert.equal(n, 3);
  assert.equal(errors.length, 2);
  assert.equal(informer.list().length, 1);
  // stop() before the first list makes start() reject; the loop ends.
  const never = new Informer<Obj>({ rest, path: PATH, list: () => new Promise(() => {}) });
  const started = assert.rejects(never.start(), /stopped before its first list/);
  await never.stop();
  await started;
});

test('a watch line beyond the bound ends the stream and relists', async (t) => {
  const r = await rig(t, { maxLineBytes: 200 });
  await r.informer.start();
  await r.ws.waitForWatch(PATH);
  r.ws.write(PATH, `{"type":"ADDED","object":${JSON.stringify(obj('big', '60', 'x'.repeat(300)))}}\n`);
  await until('relist', () => r.lists === 2);
  assert.equal(r.errors.length, 1);
  assert.match(String(r.errors[0]), /longer than 200 bytes/);
  // A garbage line also relists (the event it carried is lost).
  await r.ws.waitForWatch(PATH);
  r.ws.write(PATH, 'not json\n');
  await until('relist', () => r.lists === 3);
  // Events split across writes still arrive whole.
  await r.ws.waitForWatch(PATH);
  const line = `${JSON.stringify({ type: 'ADDED', object: obj('split', '70') })}\n`;
  r.ws.write(PATH, line.slice(0, 10));
  await new Promise((res) => setTimeout(res, 20));
  r.ws.write(PATH, line.slice(10));
  await until('split', () => r.informer.get('split', 'ns') !== undefined);
});

test('stop() closes the stream; a later start() lists again', async (t) => {
  const r = await rig(t);
  await r.informer.start();
  await r.ws.waitForWatch(PATH);
  await r.informer.stop();
  await until('closed', () => r.ws.open(PATH) === 0);
  assert.equal(r.informer.synced, false);
  await r.informer.start();
  assert.equal(r.lists, 2);
  await r.ws.waitForWatch(PATH);
});

test('a silent stream (no event, no bookmark) is re-opened after the idle bound, without an error', async (t) => {
  const ws = await startFakeWatchServer();
  const rest = new RestClient(fakeKubeConfig(ws.url));
  const informer = new Informer<Obj>({
    rest,
    path: PATH,
    list: async () => ({ items: [], metadata: { resourceVersion: '3' } }),
    idleTimeoutMs: 100,
  });
  const errors: unknown[] = [];
  informer.on('error', (e) => errors.push(e));
  t.after(async () => {
    await informer.stop();
    rest.close();
    await ws.close();
  });
  await informer.start();
  await until('re-opened', () => ws.requests.length >= 2, 3000);
  assert.equal(ws.requests[1]?.searchParams.get('resourceVersion'), '3');
  assert.deepEqual(errors, []);
});
