// Who may exec into a VM through the daemon's kubelet port, and what a flood of garbage
// tokens costs the apiserver (issue 18, docs/contracts/virtual-node.md "Authentication and
// authorization"). Against the real apiserver's RBAC, TokenReview and SubjectAccessReview:
// - a service account granted only `get` on nodes/proxy reads /pods but gets 403 for a
//   WebSocket exec (an HTTP GET) and a SPDY exec (a POST) sent straight to the kubelet port;
//   one granted `create` on nodes/proxy runs the command, and the daemon logs the exec
//   without its command line;
// - 1,000 distinct garbage bearer tokens from one source cost at most the per-source budget
//   of TokenReviews (20 plus one per 3 s), counted by the daemon's
//   cocoon_vk_kubelet_token_reviews_total; the rest are answered 429 without a review; one
//   garbage token sent 50 times costs one review.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Agent, request } from 'node:https';
import { after, before, describe, test } from 'node:test';
import WebSocket from 'ws';
import { kubectl } from '../../ground/cluster.ts';
import { podReady, vmPod, waitForPod } from '../../ground/kube.ts';
import { waitFor } from '../../ground/proc.ts';
import { useWorld, type World } from '../../ground/world.ts';
import { FAILED_AUTH_BURST, FAILED_AUTH_REFILL_MS } from '../../src/kubelet/authn-limits.ts';
import { fixture } from './helpers.ts';

const SNAPSHOT = 'acme/agent';
const POD = 'authz-0';
const world = useWorld();
let w: World;
/** Service-account tokens: `getter` may get nodes/proxy, `creator` may create it. */
const tokens = { getter: '', creator: '' };
const clusterObjects: string[] = [];

function rbac(ns: string, who: 'getter' | 'creator', verb: 'get' | 'create'): string {
  const name = `${ns}-${who}`;
  clusterObjects.push(`clusterrole/${name}`, `clusterrolebinding/${name}`);
  return [
    'apiVersion: v1',
    'kind: ServiceAccount',
    `metadata: {name: ${who}, namespace: ${ns}}`,
    '---',
    'apiVersion: rbac.authorization.k8s.io/v1',
    'kind: ClusterRole',
    `metadata: {name: ${name}}`,
    `rules: [{apiGroups: [""], resources: ["nodes/proxy"], verbs: ["${verb}"]}]`,
    '---',
    'apiVersion: rbac.authorization.k8s.io/v1',
    'kind: ClusterRoleBinding',
    `metadata: {name: ${name}}`,
    `roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ${name}}`,
    `subjects: [{kind: ServiceAccount, name: ${who}, namespace: ${ns}}]`,
    '',
  ].join('\n');
}

before(async () => {
  w = await world();
  await fixture(w, SNAPSHOT, 'linux');
  const ns = w.namespace;
  await kubectl(
    w.ground.cluster,
    ['apply', '-f', '-'],
    rbac(ns, 'getter', 'get') + '---\n' + rbac(ns, 'creator', 'create'),
  );
  for (const who of ['getter', 'creator'] as const) {
    tokens[who] = (
      await kubectl(w.ground.cluster, ['create', 'token', who, '-n', ns, '--duration=1h'])
    ).trim();
  }
  // RBAC is effective once the apiserver's authorizer says so for both.
  for (const [who, verb] of [
    ['getter', 'get'],
    ['creator', 'create'],
  ] as const) {
    await waitFor(
      `${who} may ${verb} nodes/proxy`,
      async () =>
        (
          await kubectl(w.ground.cluster, [
            'auth',
            'can-i',
            verb,
            'nodes',
            '--subresource=proxy',
            `--as=system:serviceaccount:${ns}:${who}`,
          ]).catch(() => 'no')
        ).trim() === 'yes',
      30_000,
      200,
    );
  }
  await w.core.createNamespacedPod({
    namespace: ns,
    body: vmPod(POD, w.nodeName, {
      'vm.cocoonstack.io/name': `vk-${ns}-${POD}`,
      'cocoonset.cocoonstack.io/image': SNAPSHOT,
      'cocoonset.cocoonstack.io/managed': 'true',
    }),
  });
  await waitForPod(
    w.core,
    ns,
    POD,
    'Running and Ready',
    (p) => p.status?.phase === 'Running' && podReady(p),
    60_000,
  );
});

after(async () => {
  if (w && clusterObjects.length > 0)
    await kubectl(w.ground.cluster, ['delete', '--ignore-not-found', ...clusterObjects]).catch(() => {});
});

/** Echoed by the exec; must never appear in the daemon's log (argv is not logged). */
const MARKER = `argv-marker-${Math.random().toString(36).slice(2)}`;
const execPath = () => `/exec/${w.namespace}/${POD}/agent?command=echo&command=${MARKER}&output=1`;

/** A WebSocket exec straight to the kubelet port: the refused status, or 101 with stdout. */
function wsExec(token: string): Promise<{ status: number; body: string; stdout: string }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(`wss://127.0.0.1:${w.daemon.kubeletPort}${execPath()}`, ['v5.channel.k8s.io'], {
      rejectUnauthorized: false,
      headers: { authorization: `Bearer ${token}` },
    });
    let stdout = '';
    ws.on('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (c: Buffer) => {
        body += c.toString();
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body, stdout }));
    });
    ws.on('message', (data: Buffer) => {
      if (data[0] === 1) stdout += data.subarray(1).toString();
    });
    ws.on('close', () => resolve({ status: 101, body: '', stdout }));
    ws.on('error', (err) => {
      if (!/Unexpected server response/.test(err.message)) reject(err);
    });
  });
}

/** A SPDY exec upgrade (POST) straight to the kubelet port: the answer's status. */
function spdyExec(token: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({
      host: '127.0.0.1',
      port: w.daemon.kubeletPort,
      path: execPath(),
      method: 'POST',
      rejectUnauthorized: false,
      agent: false,
      headers: {
        authorization: `Bearer ${token}`,
        connection: 'Upgrade',
        upgrade: 'SPDY/3.1',
        'x-stream-protocol-version': 'v4.channel.k8s.io',
      },
    });
    req.on('response', (res) => {
      let body = '';
      res.on('data', (c: Buffer) => {
        body += c.toString();
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('upgrade', (res, socket) => {
      socket.destroy();
      resolve({ status: res.statusCode ?? 0, body: '' });
    });
    req.on('error', reject);
    req.end();
  });
}

function kubeletGet(path: string, token: string, agent?: Agent): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port: w.daemon.kubeletPort,
        path,
        rejectUnauthorized: false,
        headers: { authorization: `Bearer ${token}` },
        ...(agent ? { agent } : { agent: false }),
      },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

/** The daemon's TokenReview counter, summed over results, and its throttle counter. */
async function authCounters(): Promise<{ reviews: number; throttled: number }> {
  const text = await (await fetch(`http://127.0.0.1:${w.daemon.metricsPort}/metrics`)).text();
  let reviews = 0;
  let throttled = 0;
  for (const line of text.split('\n')) {
    const m =
      /^(cocoon_vk_kubelet_token_reviews_total|cocoon_vk_kubelet_auth_throttled_total)(\{[^}]*\})? (\S+)$/.exec(
        line,
      );
    if (!m) continue;
    if (m[1] === 'cocoon_vk_kubelet_token_reviews_total') reviews += Number(m[3]);
    else throttled += Number(m[3]);
  }
  return { reviews, throttled };
}

describe('exec authorization on the kubelet port', () => {
  test('get on nodes/proxy reads /pods but cannot exec: WebSocket and SPDY both 403', async () => {
    assert.equal(await kubeletGet('/pods', tokens.getter), 200, 'the getter role is in effect');
    const ws = await wsExec(tokens.getter);
    assert.equal(ws.status, 403, ws.body);
    assert.match(ws.body, new RegExp(`user=system:serviceaccount:${w.namespace}:getter, verb=create`));
    const spdy = await spdyExec(tokens.getter);
    assert.equal(spdy.status, 403, spdy.body);
    assert.match(spdy.body, /verb=create, resource=nodes, subresource=proxy/);
  });

  test('create on nodes/proxy runs the command over WebSocket and is let through over SPDY', async () => {
    const ws = await wsExec(tokens.creator);
    assert.equal(ws.status, 101, ws.body);
    assert.equal(ws.stdout, `${MARKER}\n`);
    assert.equal((await spdyExec(tokens.creator)).status, 101);
    // The exec is logged with its pod and user, never with its command line.
    const log = readFileSync(w.logFile, 'utf8');
    assert.match(log, new RegExp(`"user":"system:serviceaccount:${w.namespace}:creator".*"msg":"exec"`));
    assert.equal(log.includes(MARKER), false, 'the command line is not in the daemon log');
  });
});

describe('garbage bearer tokens', () => {
  test('one garbage token sent 50 times costs one TokenReview', async () => {
    const before = await authCounters();
    for (let i = 0; i < 50; i++) assert.equal(await kubeletGet('/pods', 'garbage-repeated'), 401);
    const after = await authCounters();
    assert.equal(after.reviews - before.reviews, 1);
    assert.equal(after.throttled, before.throttled);
  });

  test('1,000 distinct garbage tokens from one source cost at most the per-source budget of TokenReviews', async (t) => {
    const before = await authCounters();
    const agent = new Agent({ keepAlive: true, maxSockets: 16, rejectUnauthorized: false });
    const started = performance.now();
    const statuses = new Map<number, number>();
    let next = 0;
    const worker = async () => {
      while (next < 1000) {
        const i = next++;
        const s = await kubeletGet('/pods', `garbage-${i}-${Math.random().toString(36).slice(2)}`, agent);
        statuses.set(s, (statuses.get(s) ?? 0) + 1);
      }
    };
    await Promise.all(Array.from({ length: 16 }, worker));
    const elapsedMs = performance.now() - started;
    agent.destroy();
    const after = await authCounters();
    const reviews = after.reviews - before.reviews;
    const throttled = after.throttled - before.throttled;
    // The budget: what was left of the burst (at most FAILED_AUTH_BURST) plus the refill
    // over the time the flood took.
    const bound = FAILED_AUTH_BURST + Math.ceil(elapsedMs / FAILED_AUTH_REFILL_MS);
    const summary = `${reviews} TokenReviews for 1000 garbage tokens in ${Math.round(elapsedMs)} ms (bound ${bound}); answers ${JSON.stringify(Object.fromEntries(statuses))}; ${throttled} throttled`;
    t.diagnostic(summary);
    console.log(`# ${summary}`);
    assert.ok(reviews >= 1 && reviews <= bound, summary);
    assert.equal((statuses.get(401) ?? 0) + (statuses.get(429) ?? 0), 1000, summary);
    assert.equal(statuses.get(401) ?? 0, reviews, 'every review rejected its token: 401');
    assert.equal(statuses.get(429) ?? 0, throttled, 'the rest: 429 without a review');
  });
});
