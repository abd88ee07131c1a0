// Connections of the REST client (src/kube/rest.ts): requests share at most
// MAX_REQUEST_SOCKETS keep-alive connections (the rest wait in the agent) and keep them
// between bursts; watches have their own connections and never take a request's place.
import assert from 'node:assert/strict';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { MAX_REQUEST_SOCKETS, RestClient } from '../../../src/kube/rest.ts';

/** `burst`: answers are held until MAX_REQUEST_SOCKETS requests are in flight at once (or
 * the burst's last request arrived), so the count of connections does not depend on how fast
 * a loaded machine runs the client (no wall-clock hold). */
async function server(t: { after: (fn: () => void) => void }, opts: { burst: number }) {
  let connections = 0;
  let inFlight = 0;
  let maxInFlight = 0;
  let received = 0;
  const held: ServerResponse[] = [];
  const watches: ServerResponse[] = [];
  const srv = createServer((req, res) => {
    if (new URL(req.url ?? '/', 'http://x').searchParams.get('watch') === 'true') {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('');
      watches.push(res);
      return;
    }
    inFlight++;
    received++;
    maxInFlight = Math.max(maxInFlight, inFlight);
    held.push(res);
    if (held.length >= MAX_REQUEST_SOCKETS || received % opts.burst === 0) {
      for (const r of held.splice(0)) {
        inFlight--;
        r.writeHead(200, { 'content-type': 'application/json' });
        r.end('{}');
      }
    }
  });
  srv.on('connection', () => connections++);
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  t.after(() => {
    for (const w of watches) w.end();
    srv.closeAllConnections();
    srv.close();
  });
  return {
    url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`,
    stats: () => ({ connections, maxInFlight, watches: watches.length }),
  };
}

test('a burst of requests shares at most MAX_REQUEST_SOCKETS connections, kept for the next burst', async (t) => {
  const s = await server(t, { burst: 100 });
  const rest = new RestClient({ server: s.url, token: () => 't', source: 'test' });
  t.after(() => rest.close());
  const burst = () =>
    Promise.all(
      Array.from({ length: 100 }, (_, i) => rest.request({ method: 'GET', path: `/api/v1/x/${i}` })),
    );
  const answers = await burst();
  assert.equal(answers.length, 100);
  assert.equal(s.stats().connections, MAX_REQUEST_SOCKETS);
  assert.equal(s.stats().maxInFlight, MAX_REQUEST_SOCKETS);
  await burst();
  assert.equal(s.stats().connections, MAX_REQUEST_SOCKETS, 'the second burst reuses the connections');
});

test('open watches do not take the connections of requests', async (t) => {
  const s = await server(t, { burst: 1 });
  const rest = new RestClient({ server: s.url, token: () => 't', source: 'test' });
  t.after(() => rest.close());
  const ac = new AbortController();
  t.after(() => ac.abort());
  const streams = await Promise.all(
    Array.from({ length: MAX_REQUEST_SOCKETS + 2 }, (_, i) => rest.watch(`/api/v1/w${i}`, {}, ac.signal)),
  );
  assert.equal(streams.length, MAX_REQUEST_SOCKETS + 2);
  assert.equal(s.stats().watches, MAX_REQUEST_SOCKETS + 2);
  const answer = await rest.request({ method: 'GET', path: '/api/v1/pods' });
  assert.deepEqual(answer, {});
  for (const r of streams) r.destroy();
});
