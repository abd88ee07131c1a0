// The REST transport and the API calls of the hand-written client (src/kube/rest.ts,
// src/kube/api.ts) against local HTTP(S) servers: the exact method, path, query, headers and
// body of every call the daemon makes; answers stay plain JSON (timestamps are strings);
// errors carry the HTTP status and the apiserver's Status message (apiStatus /
// apiErrorMessage); timeouts, aborts, the stale keep-alive retry; TLS with a cluster CA, a
// client certificate, tls-server-name and insecure-skip-tls-verify.
import assert from 'node:assert/strict';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { mock, type TestContext, test } from 'node:test';
import type { TLSSocket } from 'node:tls';
import {
  ApiError,
  apiErrorMessage,
  apiStatus,
  isFinalWriteError,
  Kube,
  mergePatch,
  strategicMergePatch,
  withSignal,
} from '../../../src/kube/client.ts';
import type { ClusterAccess } from '../../../src/kube/kubeconfig.ts';
import { RestClient } from '../../../src/kube/rest.ts';
import { MicroTime } from '../../../src/node/heartbeat.ts';
import { DeadlineError } from '../../../src/util/deadline.ts';
import { issue, makeCa } from '../fakes/pki.ts';

interface Seen {
  method: string;
  path: string;
  query: Record<string, string>;
  headers: IncomingMessage['headers'];
  body: string;
}

type Answer = { code: number; body: unknown; contentType?: string };

/** An HTTP server that records requests and answers what `answer` says (default 200 {}). */
async function apiServer(t: { after: (fn: () => void) => void }) {
  const seen: Seen[] = [];
  let answer: (s: Seen) => Answer = () => ({ code: 200, body: {} });
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const url = new URL(req.url ?? '/', 'http://x');
      const s: Seen = {
        method: req.method ?? '',
        path: url.pathname,
        query: Object.fromEntries(url.searchParams),
        headers: req.headers,
        body: Buffer.concat(chunks).toString(),
      };
      seen.push(s);
      const a = answer(s);
      res.writeHead(a.code, { 'content-type': a.contentType ?? 'application/json' });
      res.end(typeof a.body === 'string' ? a.body : JSON.stringify(a.body));
    });
  });
  await listen(server);
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return {
    url,
    seen,
    answer(fn: (s: Seen) => Answer) {
      answer = fn;
    },
  };
}

function listen(server: Server): Promise<void> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
}

/** Waits for real I/O (a request reaching a local server). The bound only turns a hang into
 * a failure: the I/O takes milliseconds, 10 s is more than 1000 times that. */
async function untilIo(what: string, cond: () => boolean, ms = 10_000): Promise<void> {
  const end = performance.now() + ms;
  while (!cond()) {
    if (performance.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setImmediate(r));
  }
}

function access(server: string, extra: Partial<ClusterAccess> = {}): ClusterAccess {
  return { server, token: () => 'tok-1', source: 'test', ...extra };
}

test('every call the daemon makes: method, path, query, content type, token and body', async (t) => {
  const api = await apiServer(t);
  const kube = new Kube(access(api.url), 1000, 1000);
  t.after(() => kube.rest.close());
  const { core, coordination, authn, authz } = kube;
  const ac = new AbortController();
  await core.listPodForAllNamespaces({ fieldSelector: 'spec.nodeName=n1' });
  await core.readNode({ name: 'n1' });
  await core.listNode({ fieldSelector: 'metadata.name=n1' });
  await core.createNode({ body: { metadata: { name: 'n1' } } });
  await core.patchNode({ name: 'n1', body: { metadata: { labels: { a: 'b' } } } }, strategicMergePatch);
  await core.patchNodeStatus({ name: 'n1', body: { status: {} } }, strategicMergePatch);
  await core.createNamespacedEvent(
    { namespace: 'ns', body: { metadata: { generateName: 'p.' }, involvedObject: {} } },
    withSignal(ac.signal),
  );
  await core.patchNamespacedEvent(
    { name: 'e1', namespace: 'ns', body: { count: 2 } },
    withSignal(ac.signal, mergePatch),
  );
  await core.patchNamespacedPod(
    { name: 'p', namespace: 'ns', body: { metadata: {} } },
    withSignal(ac.signal, mergePatch),
  );
  await core.patchNamespacedPodStatus(
    { name: 'p', namespace: 'ns', body: { status: {} } },
    strategicMergePatch,
  );
  await core.deleteNamespacedPod({
    name: 'p',
    namespace: 'ns',
    gracePeriodSeconds: 0,
    body: { gracePeriodSeconds: 0, preconditions: { uid: 'u1' } },
  });
  await core.readNamespacedConfigMap({ name: 'cm', namespace: 'ns' });
  await core.readNamespacedSecret({ name: 's', namespace: 'ns' });
  await coordination.readNamespacedLease({ name: 'n1', namespace: 'kube-node-lease' });
  await coordination.createNamespacedLease({
    namespace: 'kube-node-lease',
    body: { metadata: { name: 'n1' } },
  });
  await coordination.replaceNamespacedLease({ name: 'n1', namespace: 'kube-node-lease', body: {} });
  await authn.createTokenReview({ body: { spec: { token: 't' } } });
  await authn.createSelfSubjectReview({ body: {} });
  await authz.createSubjectAccessReview({ body: { spec: {} } });
  const calls = api.seen.map(
    (s) => `${s.method} ${s.path}${Object.keys(s.query).length ? ` ${JSON.stringify(s.query)}` : ''}`,
  );
  assert.deepEqual(calls, [
    'GET /api/v1/pods {"fieldSelector":"spec.nodeName=n1"}',
    'GET /api/v1/nodes/n1',
    'GET /api/v1/nodes {"fieldSelector":"metadata.name=n1"}',
    'POST /api/v1/nodes',
    'PATCH /api/v1/nodes/n1',
    'PATCH /api/v1/nodes/n1/status',
    'POST /api/v1/namespaces/ns/events',
    'PATCH /api/v1/namespaces/ns/events/e1',
    'PATCH /api/v1/namespaces/ns/pods/p',
    'PATCH /api/v1/namespaces/ns/pods/p/status',
    'DELETE /api/v1/namespaces/ns/pods/p {"gracePeriodSeconds":"0"}',
    'GET /api/v1/namespaces/ns/configmaps/cm',
    'GET /api/v1/namespaces/ns/secrets/s',
    'GET /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1',
    'POST /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases',
    'PUT /apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n1',
    'POST /apis/authentication.k8s.io/v1/tokenreviews',
    'POST /apis/authentication.k8s.io/v1/selfsubjectreviews',
    'POST /apis/authorization.k8s.io/v1/subjectaccessreviews',
  ]);
  const ct = api.seen.map((s) => s.headers['content-type'] ?? '-');
  assert.deepEqual(ct, [
    '-',
    '-',
    '-',
    'application/json',
    'application/strategic-merge-patch+json',
    'application/strategic-merge-patch+json',
    'application/json',
    'application/merge-patch+json',
    'application/merge-patch+json',
    'application/strategic-merge-patch+json',
    'application/json',
    '-',
    '-',
    '-',
    'application/json',
    'application/json',
    'application/json',
    'application/json',
    'application/json',
  ]);
  for (const s of api.seen) {
    assert.equal(s.headers.authorization, 'Bearer tok-1');
    assert.equal(s.headers.accept, 'application/json');
  }
  assert.deepEqual(JSON.parse(api.seen[10]?.body ?? ''), {
    gracePeriodSeconds: 0,
    preconditions: { uid: 'u1' },
  });
  assert.deepEqual(JSON.parse(api.seen[8]?.body ?? ''), { metadata: {} });
});

test('answers are the JSON as sent: timestamps stay strings; a Lease MicroTime keeps six digits', async (t) => {
  const api = await apiServer(t);
  const kube = new Kube(access(api.url));
  t.after(() => kube.rest.close());
  api.answer(() => ({
    code: 200,
    body: {
      items: [{ metadata: { name: 'p', creationTimestamp: '2026-01-02T03:04:05Z' } }],
      metadata: { resourceVersion: '9' },
    },
  }));
  const list = await kube.core.listPodForAllNamespaces();
  const ts: unknown = list.items[0]?.metadata?.creationTimestamp;
  assert.equal(ts, '2026-01-02T03:04:05Z');
  api.answer(() => ({ code: 201, body: {} }));
  const renewTime = new MicroTime(Date.parse('2026-01-02T03:04:05.678Z'));
  await kube.coordination.createNamespacedLease({
    namespace: 'kube-node-lease',
    body: { metadata: { name: 'n' }, spec: { renewTime, holderIdentity: 'n' } },
  });
  assert.equal(JSON.parse(api.seen[1]?.body ?? '').spec.renewTime, '2026-01-02T03:04:05.678000Z');
});

test('errors: the HTTP status and the Status message (404, 409, 422), text bodies, transport errors', async (t) => {
  const api = await apiServer(t);
  const kube = new Kube(access(api.url));
  t.after(() => kube.rest.close());
  const status = (code: number, reason: string, message: string): Answer => ({
    code,
    body: { kind: 'Status', apiVersion: 'v1', status: 'Failure', message, reason, code },
  });
  const cases: [Answer, number, string, string | undefined][] = [
    [status(404, 'NotFound', 'pods "p" not found'), 404, 'HTTP 404: pods "p" not found', 'NotFound'],
    [
      status(409, 'Conflict', 'Operation cannot be fulfilled on pods "p": the object has been modified'),
      409,
      'HTTP 409: Operation cannot be fulfilled on pods "p": the object has been modified',
      'Conflict',
    ],
    [
      status(422, 'Invalid', 'Pod "p" is invalid: metadata.uid: Invalid value'),
      422,
      'HTTP 422: Pod "p" is invalid: metadata.uid: Invalid value',
      'Invalid',
    ],
    [
      { code: 502, body: '<html>bad gateway</html>', contentType: 'text/html' },
      502,
      'HTTP 502: <html>bad gateway</html>',
      undefined,
    ],
    [{ code: 503, body: '' }, 503, 'HTTP 503: Service Unavailable', undefined],
  ];
  for (const [answer, code, message, reason] of cases) {
    api.answer(() => answer);
    const err = await kube.core
      .patchNamespacedPod({ name: 'p', namespace: 'ns', body: {} }, mergePatch)
      .catch((e: unknown) => e);
    assert.ok(err instanceof ApiError, String(err));
    assert.equal(apiStatus(err), code);
    assert.equal(apiErrorMessage(err), message);
    assert.equal(err.message, message);
    assert.equal(err.reason, reason);
    assert.equal(isFinalWriteError(err), code === 404 || code === 409 || code === 422);
  }
  // Nothing listens: a transport error, status 0.
  const dead = new Kube(access('http://127.0.0.1:9'));
  const err = await dead.core.readNode({ name: 'n' }).catch((e: unknown) => e);
  assert.ok(err instanceof Error);
  assert.equal(apiStatus(err), 0);
  assert.match(apiErrorMessage(err), /ECONNREFUSED/);
});

/** A server that takes requests and never answers them (closed after the test). */
async function hungServer(t: TestContext): Promise<{ hung: ServerResponse[]; url: string }> {
  const hung: ServerResponse[] = [];
  const server = createServer((_req, res) => void hung.push(res));
  await listen(server);
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return { hung, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

test('a request is bounded by its timeout and by its signal', async (t) => {
  const { hung, url } = await hungServer(t);
  const rest = new RestClient(access(url), { timeoutMs: 100 });
  t.after(() => rest.close());
  // The request timer on mock timers: it fires when the test ticks it to 100 ms, not sooner.
  mock.timers.enable({ apis: ['setTimeout'] });
  t.after(() => mock.timers.reset());
  let settled = false;
  const pending = rest
    .request({ method: 'GET', path: '/api/v1/nodes' })
    .catch((e: unknown) => e)
    .finally(() => {
      settled = true;
    });
  await untilIo('the request at the server', () => hung.length === 1);
  mock.timers.tick(99);
  await new Promise((r) => setImmediate(r));
  assert.equal(settled, false, 'not before its timeout');
  mock.timers.tick(1);
  await untilIo('the request to end at its timeout', () => settled);
  const err = await pending;
  assert.ok(err instanceof DeadlineError, String(err));
  assert.equal(apiStatus(err), 0);
  const ac = new AbortController();
  const aborting = new RestClient(access(url))
    .request({ method: 'GET', path: '/api/v1/nodes', signal: ac.signal })
    .catch((e: unknown) => e);
  await untilIo('the second request at the server', () => hung.length === 2);
  ac.abort();
  const aborted = await aborting;
  assert.equal((aborted as Error).name, 'AbortError');
  assert.equal(apiStatus(aborted), 0);
});

test('a request that meets a keep-alive socket the server has closed is sent once more', async (t) => {
  const reused = new WeakSet<object>();
  let killed = 0;
  let served = 0;
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      if (reused.has(req.socket) && killed === 0) {
        killed++;
        req.socket.destroy(); // the server closed the idle connection as the request came
        return;
      }
      reused.add(req.socket);
      served++;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ n: served }));
    });
  });
  await listen(server);
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const rest = new RestClient(access(`http://127.0.0.1:${(server.address() as AddressInfo).port}`));
  t.after(() => rest.close());
  assert.deepEqual(await rest.request({ method: 'GET', path: '/a' }), { n: 1 });
  assert.deepEqual(await rest.request({ method: 'PATCH', path: '/b', body: {} }), { n: 2 });
  assert.equal(killed, 1);
});

// ---- TLS ------------------------------------------------------------------------------------

test('TLS: the cluster CA, a client certificate, tls-server-name and insecure-skip-tls-verify', async (t) => {
  const ca = await makeCa('CN=cluster-ca');
  const other = await makeCa('CN=other-ca');
  const serving = await issue(ca, 'CN=apiserver', 'server', [{ type: 'dns', value: 'api.internal' }]);
  const client = await issue(ca, 'O=system:nodes, CN=vk-cocoon', 'client');
  const server = createHttpsServer(
    { cert: serving.cert, key: serving.key, ca: ca.cert, requestCert: true, rejectUnauthorized: false },
    (req, res) => {
      const s = req.socket as TLSSocket;
      const cn = s.authorized ? s.getPeerCertificate().subject?.CN : undefined;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ cn: cn ?? null, auth: req.headers.authorization ?? null }));
    },
  );
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const url = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const get = async (a: ClusterAccess) => {
    const rest = new RestClient(a);
    try {
      return await rest.request<{ cn: string | null; auth: string | null }>({
        method: 'GET',
        path: '/version',
      });
    } finally {
      rest.close();
    }
  };
  // The CA and the server name (the certificate names api.internal, not 127.0.0.1).
  assert.deepEqual(
    await get({
      server: url,
      ca: ca.cert,
      tlsServerName: 'api.internal',
      cert: client.cert,
      key: client.key,
      source: 't',
    }),
    { cn: 'vk-cocoon', auth: null },
  );
  await assert.rejects(get({ server: url, ca: ca.cert, source: 't' }), /altnames|IP: 127\.0\.0\.1/);
  await assert.rejects(
    get({ server: url, ca: other.cert, tlsServerName: 'api.internal', source: 't' }),
    /self[- ]signed|unable to verify|issuer/i,
  );
  assert.deepEqual(await get({ server: url, insecureSkipTLSVerify: true, token: () => 'abc', source: 't' }), {
    cn: null,
    auth: 'Bearer abc',
  });
  assert.deepEqual(
    await get({
      server: url,
      insecureSkipTLSVerify: true,
      basicAuth: { username: 'u', password: 'p' },
      source: 't',
    }),
    { cn: null, auth: `Basic ${Buffer.from('u:p').toString('base64')}` },
  );
});

test('an answer cut off mid-body is an error, not a hang', async (t) => {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' });
    res.write('{"items":[');
    setTimeout(() => res.socket?.destroy(), 20);
  });
  await listen(server);
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  // A request timeout of an hour: the error can only come from the cut, not from the timeout.
  const rest = new RestClient(access(`http://127.0.0.1:${(server.address() as AddressInfo).port}`), {
    timeoutMs: 3_600_000,
  });
  t.after(() => rest.close());
  const err = await rest.request({ method: 'GET', path: '/api/v1/pods' }).catch((e: unknown) => e);
  assert.ok(err instanceof Error, String(err));
  assert.ok(!(err instanceof DeadlineError), `${err} (the cut, not the timeout)`);
  assert.equal(apiStatus(err), 0);
});

test('a watch that ends before its answer settles and leaves no deadline timer behind', async (t) => {
  const { hung, url } = await hungServer(t);
  const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
  const before = timers();
  // Aborted by its signal while the server has not answered.
  const rest = new RestClient(access(url), { timeoutMs: 60_000 });
  t.after(() => rest.close());
  const ac = new AbortController();
  const aborted = rest.watch('/api/v1/pods', {}, ac.signal).catch((e: unknown) => e);
  await untilIo('the watch at the server', () => hung.length === 1);
  ac.abort();
  assert.equal(((await aborted) as Error).name, 'AbortError');
  // Its client closed under it (shutdown) while the server has not answered.
  const closing = new RestClient(access(url), { timeoutMs: 60_000 });
  const cut = closing.watch('/api/v1/pods', {}).catch((e: unknown) => e);
  await untilIo('the second watch at the server', () => hung.length === 2);
  closing.close();
  assert.ok((await cut) instanceof Error, 'the watch settles with an error');
  await untilIo('the requests to close', () => timers() === before);
});
