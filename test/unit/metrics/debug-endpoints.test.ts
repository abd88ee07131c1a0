// The debug endpoints of the metrics listener (VK_DEBUG_ENDPOINTS, docs/operations.md
// "Profiling in place"): 404 when off; when on, a CPU profile Chrome DevTools loads (a
// Profiler.Profile: nodes, samples, timeDeltas) and a heap snapshot (snapshot meta, nodes,
// edges, strings), one at a time. The profile's N seconds run on mock timers: the test ticks
// them, so no assertion depends on how fast the machine is.
import assert from 'node:assert/strict';
import { request } from 'node:http';
import { describe, it, mock, type TestContext } from 'node:test';
import { loadConfig } from '../../../src/config/env.ts';
import { silentLogger } from '../../../src/log.ts';
import { createMetrics } from '../../../src/metrics/registry.ts';
import { type MetricsServer, profileSeconds, startMetricsServer } from '../../../src/metrics/server.ts';

interface Reply {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  body: string;
}

function get(port: number, path: string, method = 'GET'): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, method, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          headers: res.headers,
          body: Buffer.concat(chunks).toString('utf8'),
        }),
      );
    });
    req.on('error', reject);
    req.end();
  });
}

async function withServer(
  debugEndpoints: boolean | undefined,
  fn: (port: number) => Promise<void>,
): Promise<void> {
  const server: MetricsServer | undefined = await startMetricsServer({
    addr: '127.0.0.1:0',
    metrics: createMetrics(),
    log: silentLogger,
    ...(debugEndpoints === undefined ? {} : { debugEndpoints }),
  });
  assert.ok(server);
  try {
    await fn(server.address().port);
  } finally {
    await server.close();
  }
}

/** Mocks setTimeout for the rest of the test and records the delays it is set with, so the
 * test knows when the profile's N-second timer runs (and only then ticks it). */
function mockTimers(t: TestContext): { set: (ms: number) => boolean } {
  mock.timers.enable({ apis: ['setTimeout'] });
  const spy = mock.method(globalThis, 'setTimeout');
  t.after(() => {
    spy.mock.restore();
    mock.timers.reset();
  });
  return { set: (ms) => spy.mock.calls.some((c) => c.arguments[1] === ms) };
}

/** Waits for real I/O (the server's answers, the inspector session). The bound only turns a
 * hang into a failure: each step takes milliseconds, 10 s is far more than 10 times that. */
async function untilIo(what: string, cond: () => boolean | Promise<boolean>, ms = 10_000): Promise<void> {
  const end = performance.now() + ms;
  while (!(await cond())) {
    if (performance.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setImmediate(r));
  }
}

/** Some work for the profiler to see. */
function burn(ms: number): number {
  const end = Date.now() + ms;
  let x = 0;
  while (Date.now() < end) x += Math.sqrt(x + 1);
  return x;
}

describe('VK_DEBUG_ENDPOINTS', () => {
  it('is off by default and parsed as a boolean', () => {
    assert.equal(loadConfig({}).debugEndpoints, false);
    assert.equal(
      loadConfig({ VK_DEBUG_ENDPOINTS: 'true', VK_METRICS_ADDR: '127.0.0.1:9091' }).debugEndpoints,
      true,
    );
    assert.throws(() => loadConfig({ VK_DEBUG_ENDPOINTS: 'yes' }), /VK_DEBUG_ENDPOINTS="yes"/);
  });

  it('bounds ?seconds= to 1-60 (default 30)', () => {
    assert.equal(profileSeconds(null), 30);
    assert.equal(profileSeconds('1'), 1);
    assert.equal(profileSeconds('60'), 60);
    for (const bad of ['0', '61', '-1', '1.5', 'abc', '1e1'])
      assert.equal(typeof profileSeconds(bad), 'string', bad);
  });
});

describe('debug endpoints', () => {
  it('answer 404 when disabled (default and false), /metrics still served', async () => {
    for (const flag of [undefined, false]) {
      await withServer(flag, async (port) => {
        for (const path of ['/debug/pprof/profile?seconds=1', '/debug/pprof/heap', '/debug/pprof/']) {
          assert.equal((await get(port, path)).status, 404, `${flag} ${path}`);
        }
        assert.equal((await get(port, '/metrics')).status, 200);
      });
    }
  });

  it('serve a loadable CPU profile of N seconds', async (t) => {
    const timers = mockTimers(t);
    await withServer(true, async (port) => {
      let answered = false;
      const pending = get(port, '/debug/pprof/profile?seconds=1').finally(() => {
        answered = true;
      });
      await untilIo('the 1 s recording to start', () => timers.set(1000));
      // Busy while the profile runs: a second profile and a heap snapshot are refused.
      const busy = await get(port, '/debug/pprof/heap');
      assert.equal(busy.status, 409);
      assert.match(busy.body, /CPU profile is being taken/);
      assert.equal((await get(port, '/debug/pprof/profile?seconds=1')).status, 409);
      burn(300);
      // It records for its N seconds, not a moment less (the clock is mocked: only ticks move it).
      mock.timers.tick(999);
      assert.equal((await get(port, '/debug/pprof/heap')).status, 409, 'still recording at 999 ms');
      assert.equal(answered, false);
      mock.timers.tick(1);
      await untilIo('the profile at 1 s', () => answered);
      const r = await pending;
      assert.equal(r.status, 200, r.body);
      assert.equal(r.headers['content-type'], 'application/json');
      assert.match(String(r.headers['content-disposition']), /filename="vk-cocoon-.*\.cpuprofile"/);
      const profile = JSON.parse(r.body) as {
        nodes: Array<{ id: number; callFrame: { functionName: string } }>;
        samples: number[];
        timeDeltas: number[];
        startTime: number;
        endTime: number;
      };
      assert.ok(Array.isArray(profile.nodes) && profile.nodes.length > 1);
      assert.ok(Array.isArray(profile.samples) && profile.samples.length > 0);
      assert.equal(profile.timeDeltas.length, profile.samples.length);
      // Real time recorded (microseconds): at least the 300 ms burned while it ran.
      assert.ok(profile.endTime - profile.startTime >= 300_000, 'the recording spans the burn');
      assert.ok(
        profile.nodes.some((n) => n.callFrame.functionName === 'burn'),
        'the busy function is in the profile',
      );
      // Free again once done.
      assert.equal((await get(port, '/debug/pprof/heap')).status, 200);
    });
  });

  it('serve a loadable heap snapshot', async () => {
    await withServer(true, async (port) => {
      const r = await get(port, '/debug/pprof/heap');
      assert.equal(r.status, 200);
      assert.equal(r.headers['content-type'], 'application/json');
      assert.match(String(r.headers['content-disposition']), /filename="vk-cocoon-.*\.heapsnapshot"/);
      const snap = JSON.parse(r.body) as {
        snapshot: { meta: { node_fields: string[] }; node_count: number };
        nodes: number[];
        edges: number[];
        strings: string[];
      };
      assert.ok(snap.snapshot.meta.node_fields.includes('self_size'));
      assert.ok(snap.snapshot.node_count > 0);
      assert.equal(snap.nodes.length, snap.snapshot.node_count * snap.snapshot.meta.node_fields.length);
      assert.ok(snap.edges.length > 0 && snap.strings.length > 0);
    });
  });

  it('refuse bad requests: 400 for seconds out of range, 405 for other methods, 404 elsewhere', async () => {
    await withServer(true, async (port) => {
      for (const s of ['0', '61', 'x']) {
        const r = await get(port, `/debug/pprof/profile?seconds=${s}`);
        assert.equal(r.status, 400, s);
        assert.match(r.body, /expected an integer from 1 to 60/);
      }
      assert.equal((await get(port, '/debug/pprof/heap', 'POST')).status, 405);
      assert.equal((await get(port, '/debug/pprof/goroutine')).status, 404);
      assert.equal((await get(port, '/metrics')).status, 200);
    });
  });

  it('stop the recording when the client goes away, and are free again', async (t) => {
    const timers = mockTimers(t);
    await withServer(true, async (port) => {
      const req = request({
        host: '127.0.0.1',
        port,
        path: '/debug/pprof/profile?seconds=30',
        agent: false,
      });
      req.on('error', () => {});
      req.end();
      await untilIo('the 30 s recording to start', () => timers.set(30_000));
      req.destroy();
      // Freed by the client going away, not by the end of its 30 s: the mocked clock never moves.
      let status = 409;
      await untilIo('the endpoint to be free', async () => {
        status = (await get(port, '/debug/pprof/heap')).status;
        return status !== 409;
      });
      assert.equal(status, 200, 'the aborted profile released the endpoint');
    });
  });
});
