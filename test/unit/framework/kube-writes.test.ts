// Bounded waiting of API writes: token waits have a bound and can be aborted, high-priority
// writes go first, a request has a timeout that really aborts the HTTP request, and the
// retry policy of lifecycle/status writes.
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
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

/** Settles within `ms` or reports that it did not (so a regression fails instead of hanging). */
async function within<T>(p: Promise<T>, ms: number): Promise<{ value?: T; error?: unknown; ms: number }> {
  const t0 = performance.now();
  const timeout = Symbol('timeout');
  const res = await Promise.race([
    p.then(
      (value) => ({ value }),
      (error: unknown) => ({ error }),
    ),
    sleep(ms, timeout),
  ]);
  if (res === timeout) assert.fail(`did not settle within ${ms} ms`);
  return { ...(res as { value?: T; error?: unknown }), ms: performance.now() - t0 };
}

test('TokenBucket: a take whose wait would exceed maxWaitMs rejects at once', async () => {
  const b = new TokenBucket(10, 1);
  await b.take();
  // The next token is 100 ms away: more than the 50 ms bound.
  const r = await within(b.take({ maxWaitMs: 50 }), 1000);
  assert.ok(r.error instanceof WriteWaitError, String(r.error));
  assert.equal(r.error.reason, 'bound');
  assert.match(r.error.message, /bound of 50 ms/);
  assert.ok(r.ms < 30, `rejected after ${r.ms} ms`);
  assert.equal(b.waiting, 0);
  // Within the bound it waits and gets the token.
  const ok = await within(b.take({ maxWaitMs: 500 }), 1000);
  assert.equal(ok.error, undefined);
});

test('TokenBucket: an aborted wait rejects at once and gives its place up', async () => {
  const b = new TokenBucket(20, 1);
  await b.take();
  const ac = new AbortController();
  const first = b.take({ signal: ac.signal });
  const t0 = performance.now();
  const second = b.take();
  setTimeout(() => ac.abort(), 10);
  const r = await within(first, 1000);
  assert.ok(r.error instanceof WriteWaitError && r.error.reason === 'aborted', String(r.error));
  assert.ok(r.ms < 40, `abort took ${r.ms} ms`);
  await second;
  const waited = performance.now() - t0;
  // The second waiter gets the first token (50 ms), not the one after it (100 ms).
  assert.ok(waited < 90, `second waiter waited ${waited} ms`);
});

test('TokenBucket: high-priority takers are served before waiting normal ones; the bound still holds', async () => {
  const b = new TokenBucket(50, 1);
  await b.take();
  // The next token (20 ms away) is promised to a blocker queued now, so a loaded machine that
  // stalls before the takes below are queued cannot hand the first of them a free token out
  // of rank (seen under CI load).
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
  await Promise.all(all);
  assert.deepEqual(order.slice(0, 4), ['h1', 'h2', 'h3', 'h4']);
  assert.ok(order.indexOf('n3:rejected') >= 0, order.join(' '));
  assert.ok(order.indexOf('n1') < order.indexOf('n2'), order.join(' '));
});

test('Kube.write: timeoutMs aborts the request signal and rejects at the bound', async () => {
  const { kube, core } = fakeKube();
  core.on('patchNamespacedPod', (_p, call) => hangUntilAborted(call));
  const r = await within(
    kube.write(
      (signal) => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }, withSignal(signal)),
      {
        timeoutMs: 100,
      },
    ),
    2000,
  );
  assert.ok(r.error instanceof DeadlineError, String(r.error));
  assert.equal(r.error.message, 'API request timed out after 100 ms');
  assert.equal(apiStatus(r.error), 0);
  assert.ok(r.ms >= 95 && r.ms < 400, `rejected after ${r.ms} ms`);
  assert.equal(core.callsOf('patchNamespacedPod')[0]?.signal?.aborted, true);
  // A request that ignores its signal is abandoned at the bound all the same.
  core.on('patchNamespacedPod', () => blackHole());
  const r2 = await within(
    kube.write(() => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }), {
      timeoutMs: 100,
    }),
    2000,
  );
  assert.ok(r2.error instanceof DeadlineError);
});

test('Kube.write: the token wait is bounded, and the bound is reported as such', async () => {
  const { kube, core } = fakeKube({ qps: 1, burst: 1 });
  await kube.write(() => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }));
  const r = await within(
    kube.write(() => kube.core.patchNamespacedPod({ name: 'b', namespace: 'n', body: {} }), {
      maxWaitMs: 200,
    }),
    2000,
  );
  assert.ok(r.error instanceof WriteWaitError, String(r.error));
  assert.ok(r.ms < 50);
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
  const r = await within(
    kube.write(
      (signal) =>
        kube.core.patchNamespacedPodStatus(
          { name: 'p', namespace: 'n', body: { status: {} } },
          withSignal(signal, strategicMergePatch),
        ),
      { timeoutMs: 300 },
    ),
    3000,
  );
  assert.ok(r.error instanceof DeadlineError, String(r.error));
  assert.equal(seen.length, 1);
  assert.equal(seen[0]?.method, 'PATCH');
  assert.equal(seen[0]?.headers['content-type'], 'application/strategic-merge-patch+json');
  // The client closed the connection: the request was aborted, not just abandoned.
  for (let i = 0; i < 100 && closed === 0; i++) await sleep(10);
  assert.equal(closed, 1);
});

test('Kube.writeRetrying: 3 attempts 500 ms apart; 404/409/422 are not retried', async () => {
  const { kube, core } = fakeKube();
  let n = 0;
  core.on('patchNamespacedPod', () => {
    n++;
    throw apiError(500, 'boom');
  });
  const t0 = performance.now();
  const err = await kube
    .writeRetrying(() => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }), {
      retryDelayMs: 20,
    })
    .catch((e: unknown) => e);
  assert.ok(err instanceof WriteAttemptsError, String(err));
  assert.equal(err.attempts, 3);
  assert.equal(apiStatus(err), 500);
  assert.match(err.message, /HTTP 500: boom \(3 attempts\)/);
  assert.equal(n, 3);
  assert.ok(performance.now() - t0 >= 38);
  for (const code of [404, 409, 422]) {
    n = 0;
    core.on('patchNamespacedPod', () => {
      n++;
      throw apiError(code);
    });
    const e = await kube
      .writeRetrying(() => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }))
      .catch((x: unknown) => x);
    assert.equal(apiStatus(e), code);
    assert.equal(n, 1, `HTTP ${code} is not retried`);
  }
  // A success after a failure returns the answer.
  n = 0;
  core.on('patchNamespacedPod', () => {
    if (++n === 1) throw apiError(503);
    return { metadata: { resourceVersion: '7' } };
  });
  const ok = await kube.writeRetrying(
    () => kube.core.patchNamespacedPod({ name: 'a', namespace: 'n', body: {} }),
    {
      retryDelayMs: 1,
    },
  );
  assert.equal(ok.metadata?.resourceVersion, '7');
});
