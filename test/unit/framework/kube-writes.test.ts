// Bounded waiting of API writes: token waits have a bound and can be aborted, high-priority
// writes go first, a request has a timeout that really aborts the HTTP request, and the
// retry policy of lifecycle/status writes. Time is mocked (node:test mock timers, and the
// token buckets on the mocked Date clock): "at once" means before any timer fired, and every
// bound is checked at its exact millisecond, so no assertion depends on how busy the machine is.
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mock, test } from 'node:test';
import {
  apiStatus,
  Kube,
  strategicMergePatch,
  TokenBucket,
  WriteAttemptsError,
  WriteWaitError,
  withSignal,
} from '../../../src/kube/client.ts';
import { DeadlineError } from '../../../src/util/deadline.ts';
import { apiError, blackHole, fakeKube, fakeKubeConfig, hangUntilAborted } from '../fakes/kube.ts';

/** Mocks setTimeout and Date (from 0) for the rest of the test. */
function mockTime(t: { after: (fn: () => void) => void }): void {
  mock.timers.enable({ apis: ['setTimeout', 'Date'], now: 0 });
  t.after(() => mock.timers.reset());
}

/** The bucket's clock: the mocked Date, so it moves with mock.timers.tick and nothing else. */
const mockedNow = () => Date.now();

/** Lets promise callbacks and pending I/O run; no timer fires (they are mocked). */
async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}

interface Tracked<T> {
  settled: boolean;
  value?: T;
  error?: unknown;
}

/** Follows `p` so a test can ask whether it has settled yet. */
function track<T>(p: Promise<T>): Tracked<T> {
  const s: Tracked<T> = { settled: false };
  p.then(
    (value) => {
      s.settled = true;
      s.value = value;
    },
    (error: unknown) => {
      s.settled = true;
      s.error = error;
    },
  );
  return s;
}

/** Advances the mocked clock by `ms` and lets what it released run. */
async function tick(ms: number): Promise<void> {
  mock.timers.tick(ms);
  await flush();
}

/** Waits for real I/O (an HTTP request reaching a local server). The bound only turns a
 * hang into a failure: the I/O takes milliseconds, 10 s is more than 1000 times that. */
async function untilIo(what: string, cond: () => boolean, ms = 10_000): Promise<void> {
  const end = performance.now() + ms;
  while (!cond()) {
    if (performance.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setImmediate(r));
  }
}

test('TokenBucket: a take whose wait would exceed maxWaitMs rejects at once', async (t) => {
  mockTime(t);
  const b = new TokenBucket(10, 1, { now: mockedNow });
  await b.take();
  // The next token is 100 ms away: more than the 50 ms bound. Refused before any time passed.
  const r = track(b.take({ maxWaitMs: 50 }));
  await flush();
  assert.equal(r.settled, true, 'rejected without waiting');
  assert.ok(r.error instanceof WriteWaitError, String(r.error));
  assert.equal(r.error.reason, 'bound');
  assert.match(r.error.message, /bound of 50 ms/);
  assert.equal(b.waiting, 0);
  // Within the bound it waits and gets the token, 100 ms after the first one was taken.
  const ok = track(b.take({ maxWaitMs: 500 }));
  await tick(99);
  assert.equal(ok.settled, false, 'not before the next token');
  await tick(1);
  assert.equal(ok.settled, true);
  assert.equal(ok.error, undefined);
});

test('TokenBucket: an aborted wait rejects at once and gives its place up', async (t) => {
  mockTime(t);
  const b = new TokenBucket(20, 1, { now: mockedNow });
  await b.take();
  const ac = new AbortController();
  const first = track(b.take({ signal: ac.signal }));
  const second = track(b.take());
  await tick(10);
  ac.abort();
  await flush();
  // At once: 10 ms in, long before the next token (50 ms).
  assert.equal(first.settled, true, 'rejected when aborted, not when a token came');
  assert.ok(first.error instanceof WriteWaitError && first.error.reason === 'aborted', String(first.error));
  assert.equal(b.waiting, 1);
  // The second waiter gets the first token (50 ms), not the one after it (100 ms).
  await tick(39);
  assert.equal(second.settled, false);
  await tick(1);
  assert.equal(second.settled, true);
  assert.equal(second.error, undefined);
});

test('TokenBucket: high-priority takers are served before waiting normal ones; the bound still holds', async (t) => {
  mockTime(t);
  const b = new TokenBucket(50, 1, { now: mockedNow });
  await b.take();
  // The next token (20 ms away) is promised to a blocker queued first.
  void b.take({ priority: 'high' });
  const order: string[] = [];
  const take = (name: string, priority: 'high' | 'normal', maxWaitMs?: number) =>
    b.take({ priority, maxWaitMs }).then(
      () => order.push(name),
      () => order.push(`${name}:rejected`),
    );
  const all = [take('n1', 'normal'), take('n2', 'normal'), take('h1', 'high'), take('h2', 'high')];
  // A normal waiter whose estimate fit (5 ahead: 120 ms) but which high takers pushed back
  // is rejected by the backstop at its bound.
  all.push(take('n3', 'normal', 130));
  all.push(take('h3', 'high'), take('h4', 'high'));
  const done = track(Promise.all(all));
  for (let ms = 0; ms < 1000 && !done.settled; ms += 10) await tick(10);
  assert.equal(done.settled, true);
  assert.deepEqual(order.slice(0, 4), ['h1', 'h2', 'h3', 'h4']);
  assert.ok(order.indexOf('n3:rejected') >= 0, order.join(' '));
  assert.ok(order.indexOf('n1') < order.indexOf('n2'), order.join(' '));
});

test('Kube.write: timeoutMs aborts the request signal and rejects at the bound', async (t) => {
  mockTime(t);
  const { kube, core } = fakeKube();
  core.on('patchNamespacedPod', (_p, call) => hangUntilAborted(call));
  const r = track(
    kube.write(
      (signal) => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }, withSignal(signal)),
      {
        timeoutMs: 100,
      },
    ),
  );
  await flush();
  const [call] = core.callsOf('patchNamespacedPod');
  assert.ok(call, 'sent at once');
  await tick(99);
  assert.equal(r.settled, false, 'not before the bound');
  assert.equal(call.signal?.aborted, false);
  await tick(1);
  assert.equal(r.settled, true, 'rejected at the bound');
  assert.ok(r.error instanceof DeadlineError, String(r.error));
  assert.equal(r.error.message, 'API request timed out after 100 ms');
  assert.equal(apiStatus(r.error), 0);
  assert.equal(call.signal?.aborted, true);
  // A request that ignores its signal is abandoned at the bound all the same.
  core.on('patchNamespacedPod', () => blackHole());
  const r2 = track(
    kube.write(() => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }), {
      timeoutMs: 100,
    }),
  );
  await flush();
  await tick(99);
  assert.equal(r2.settled, false);
  await tick(1);
  assert.ok(r2.error instanceof DeadlineError, String(r2.error));
});

test('Kube.write: the token wait is bounded, and the bound is reported as such', async (t) => {
  mockTime(t);
  const { kube, core } = fakeKube();
  // 1 write/s, burst 1, on the mocked clock.
  (kube as { writes: TokenBucket }).writes = new TokenBucket(1, 1, { now: mockedNow });
  await kube.write(() => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }));
  const r = track(
    kube.write(() => kube.core.patchNamespacedPod({ name: 'b', namespace: 'n', body: {} }), {
      maxWaitMs: 200,
    }),
  );
  await flush();
  // The next token is 1 s away, beyond the 200 ms bound: refused before any time passed.
  assert.equal(r.settled, true, 'refused without waiting');
  assert.ok(r.error instanceof WriteWaitError, String(r.error));
  assert.equal(r.error.reason, 'bound');
  assert.equal(core.callsOf('patchNamespacedPod').length, 1, 'the rejected write was never sent');
});

test('withSignal carries the timeout into the real HTTP request of client-node', async (t) => {
  const seen: IncomingMessage[] = [];
  let closed = 0;
  const server = createServer((req) => {
    seen.push(req); // never answers: a black-holed apiserver
    req.socket.on('close', () => closed++);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const port = (server.address() as AddressInfo).port;
  const kube = new Kube(fakeKubeConfig(`http://127.0.0.1:${port}`), 100, 100);
  mockTime(t);
  const r = track(
    kube.write(
      (signal) =>
        kube.core.patchNamespacedPodStatus(
          { name: 'p', namespace: 'n', body: { status: {} } },
          withSignal(signal, strategicMergePatch),
        ),
      { timeoutMs: 300 },
    ),
  );
  await untilIo('the request at the server', () => seen.length === 1);
  await tick(299);
  assert.equal(r.settled, false, 'not before the bound');
  assert.equal(closed, 0);
  await tick(1);
  assert.equal(r.settled, true, 'rejected at the bound');
  assert.ok(r.error instanceof DeadlineError, String(r.error));
  assert.equal(seen.length, 1);
  assert.equal(seen[0]?.method, 'PATCH');
  assert.equal(seen[0]?.headers['content-type'], 'application/strategic-merge-patch+json');
  // The client closed the connection: the request was aborted, not just abandoned.
  await untilIo('the connection to close', () => closed === 1);
  assert.equal(closed, 1);
});

test('Kube.writeRetrying: 3 attempts 500 ms apart; 404/409/422 are not retried', async (t) => {
  mockTime(t);
  const { kube, core } = fakeKube();
  let n = 0;
  core.on('patchNamespacedPod', () => {
    n++;
    throw apiError(500, 'boom');
  });
  const r = track(
    kube.writeRetrying(() => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }), {
      retryDelayMs: 20,
    }),
  );
  await flush();
  assert.equal(n, 1);
  // Each retry comes after the pause, not sooner.
  await tick(19);
  assert.equal(n, 1);
  await tick(1);
  assert.equal(n, 2);
  await tick(19);
  assert.equal(n, 2);
  await tick(1);
  assert.equal(n, 3);
  assert.equal(r.settled, true);
  const err = r.error;
  assert.ok(err instanceof WriteAttemptsError, String(err));
  assert.equal(err.attempts, 3);
  assert.equal(apiStatus(err), 500);
  assert.match(err.message, /HTTP 500: boom \(3 attempts\)/);
  for (const code of [404, 409, 422]) {
    n = 0;
    core.on('patchNamespacedPod', () => {
      n++;
      throw apiError(code);
    });
    const e = track(
      kube.writeRetrying(() => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} })),
    );
    await flush();
    assert.equal(e.settled, true, `HTTP ${code} is rethrown at once, without a pause`);
    assert.equal(apiStatus(e.error), code);
    assert.equal(n, 1, `HTTP ${code} is not retried`);
  }
  // A success after a failure returns the answer.
  n = 0;
  core.on('patchNamespacedPod', () => {
    if (++n === 1) throw apiError(503);
    return { metadata: { resourceVersion: '7' } };
  });
  const ok = track(
    kube.writeRetrying(() => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }), {
      retryDelayMs: 1,
    }),
  );
  await flush();
  assert.equal(n, 1);
  await tick(1);
  assert.equal(ok.error, undefined);
  assert.equal(ok.value?.metadata?.resourceVersion, '7');
});
