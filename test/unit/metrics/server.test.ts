import assert from 'node:assert/strict';
import { request } from 'node:http';
import { describe, it } from 'node:test';
import { silentLogger } from '../../../src/log.ts';
import { createMetrics } from '../../../src/metrics/registry.ts';
import { parseListenAddress, startMetricsServer } from '../../../src/metrics/server.ts';
import { parsePromText } from './prom-text.ts';

function get(
  port: number,
  path: string,
  method = 'GET',
): Promise<{ status: number; type: string | undefined; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, method, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        body += c;
      });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, type: res.headers['content-type'], body }));
    });
    req.on('error', reject);
    req.end();
  });
}

describe('parseListenAddress', () => {
  it('accepts host:port, :port and [v6]:port; empty disables', () => {
    assert.equal(parseListenAddress(''), undefined);
    assert.deepEqual(parseListenAddress(':9091'), { host: undefined, port: 9091 });
    assert.deepEqual(parseListenAddress('127.0.0.1:0'), { host: '127.0.0.1', port: 0 });
    assert.deepEqual(parseListenAddress('localhost:8080'), { host: 'localhost', port: 8080 });
    assert.deepEqual(parseListenAddress('[::1]:9091'), { host: '::1', port: 9091 });
  });

  it('rejects malformed addresses', () => {
    for (const bad of ['9091', 'host', ':', ':99999', 'a b:1', 'http://x:1', ':-1']) {
      assert.throws(() => parseListenAddress(bad), /invalid listen address/, bad);
    }
  });
});

describe('startMetricsServer', () => {
  it('is disabled by an empty address', async () => {
    assert.equal(
      await startMetricsServer({ addr: '', metrics: createMetrics(), log: silentLogger }),
      undefined,
    );
  });

  it('serves /metrics on 127.0.0.1:0 and 404 elsewhere', async () => {
    const metrics = createMetrics();
    metrics.podLifecycle.inc({ op: 'create', result: 'ok', reason: '' });
    const server = await startMetricsServer({ addr: '127.0.0.1:0', metrics, log: silentLogger });
    assert.ok(server);
    try {
      const port = server.address().port;
      assert.ok(port > 0);
      const ok = await get(port, '/metrics');
      assert.equal(ok.status, 200);
      assert.match(ok.type ?? '', /^text\/plain; version=0\.0\.4/);
      const text = parsePromText(ok.body);
      assert.equal(text.families.get('cocoon_vk_pod_lifecycle_total')?.type, 'counter');
      assert.equal(
        text.samples.find((s) => s.name === 'cocoon_vk_pod_lifecycle_total' && s.labels.op === 'create')
          ?.value,
        1,
      );
      const withQuery = await get(port, '/metrics?x=1');
      assert.equal(withQuery.status, 200);
      assert.equal((await get(port, '/')).status, 404);
      assert.equal((await get(port, '/metrics/resource')).status, 404);
      assert.equal((await get(port, '/metrics', 'POST')).status, 405);
      const head = await get(port, '/metrics', 'HEAD');
      assert.equal(head.status, 200);
      assert.equal(head.body, '');
    } finally {
      await server.close();
    }
  });

  it('answers 500 when rendering fails, and close() frees the port', async () => {
    const server = await startMetricsServer({
      addr: '127.0.0.1:0',
      metrics: { contentType: 'text/plain', render: () => Promise.reject(new Error('nope')) },
      log: silentLogger,
    });
    assert.ok(server);
    const port = server.address().port;
    assert.equal((await get(port, '/metrics')).status, 500);
    await server.close();
    await assert.rejects(get(port, '/metrics'), /ECONNREFUSED/);
  });

  it('fails to start on a port already in use', async () => {
    const a = await startMetricsServer({ addr: '127.0.0.1:0', metrics: createMetrics(), log: silentLogger });
    assert.ok(a);
    try {
      await assert.rejects(
        startMetricsServer({
          addr: `127.0.0.1:${a.address().port}`,
          metrics: createMetrics(),
          log: silentLogger,
        }),
        /EADDRINUSE/,
      );
    } finally {
      await a.close();
    }
  });
});
