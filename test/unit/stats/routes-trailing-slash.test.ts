// The stats routes in their trailing-slash forms (`/stats/summary/`, `/metrics/resource/`),
// which some clients ask for, served through the real kubelet HTTPS server (and authorized
// with the same subresource as the bare forms).
import assert from 'node:assert/strict';
import { request } from 'node:https';
import { after, before, describe, it } from 'node:test';
import { requestAttributes } from '../../../src/kubelet/auth.ts';
import { KubeletServer } from '../../../src/kubelet/server.ts';
import { silentLogger } from '../../../src/log.ts';
import { statsRoutes } from '../../../src/stats/routes.ts';
import { StatsSampler } from '../../../src/stats/sampler.ts';
import { issue, makeCa } from '../fakes/pki.ts';
import { parsePromText } from '../metrics/prom-text.ts';
import { type FakeHost, fakeHost, MEMINFO, procStat, vm } from './fake-host.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('stats/routes-trailing-slash', () => {
  let host: FakeHost;
  let server: KubeletServer;
  const seen: string[] = [];

  function get(path: string): Promise<{ status: number; type: string | undefined; body: string }> {
    return new Promise((resolve, reject) => {
      const req = request(
        { host: '127.0.0.1', port: server.port, path, agent: false, rejectUnauthorized: false },
        (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => {
            body += c;
          });
          res.on('end', () =>
            resolve({ status: res.statusCode ?? 0, type: res.headers['content-type'], body }),
          );
        },
      );
      req.on('error', reject);
      req.end();
    });
  }

  before(async () => {
    host = await fakeHost();
    await host.write('proc/stat', procStat(3000, 1000, 50000));
    await host.write('proc/meminfo', MEMINFO);
    const v = vm();
    await host.cpuStat(v.vmId, 1_000_000);
    await host.procStatus(v.pid, 2048);
    const ca = await makeCa('CN=test-ca');
    const serving = await issue(ca, 'CN=vk-test', 'server', [{ type: 'ip', value: '127.0.0.1' }]);
    server = new KubeletServer({
      port: 0,
      host: '127.0.0.1',
      cert: serving.cert,
      key: serving.key,
      clientCa: undefined,
      authorize: async (req) => {
        const path = new URL(req.url ?? '/', 'https://x').pathname;
        seen.push(`${path} ${requestAttributes(req.method ?? 'GET', path).subresource}`);
        return { ok: true, user: { name: 'metrics-server', groups: [] } };
      },
      provider: {} as never,
      nodePods: () => [],
      runningPods: () => [],
      extraRoutes: statsRoutes(new StatsSampler(() => [v], host.config), 'cocoon-pool', new Date(0)),
      streamIdleTimeoutMs: 60_000,
      log: silentLogger,
    });
    await server.listen();
  });

  after(async () => {
    await server.close();
    await host.cleanup();
  });

  describe('stats routes with a trailing slash', () => {
    it('serve /stats/summary/ like /stats/summary', async () => {
      const bare = await get('/stats/summary');
      const slash = await get('/stats/summary/');
      for (const r of [bare, slash]) {
        assert.equal(r.status, 200);
        assert.equal(r.type, 'application/json');
      }
      const s = JSON.parse(slash.body);
      assert.equal(s.node.nodeName, 'cocoon-pool');
      assert.equal(s.pods[0].podRef.name, 'agent-0');
      assert.equal(s.pods[0].cpu.usageCoreNanoSeconds, 1_000_000_000);
      assert.equal(s.pods[0].containers[0].memory.workingSetBytes, 2048 * 1024);
    });

    it('serve /metrics/resource/ like /metrics/resource', async () => {
      const r = await get('/metrics/resource/');
      assert.equal(r.status, 200);
      assert.equal(r.type, 'text/plain; version=0.0.4');
      const text = parsePromText(r.body);
      const cpu = text.samples.find((s) => s.name === 'container_cpu_usage_seconds_total');
      assert.equal(cpu?.value, 1);
      assert.equal(cpu?.labels.pod, 'agent-0');
    });

    it('authorize them on the same subresource as the bare forms; other slashes stay 404', async () => {
      assert.deepEqual(requestAttributes('GET', '/stats/summary/'), { verb: 'get', subresource: 'stats' });
      assert.deepEqual(requestAttributes('GET', '/metrics/resource/'), {
        verb: 'get',
        subresource: 'metrics',
      });
      assert.ok(seen.includes('/metrics/resource/ metrics'));
      assert.ok(seen.includes('/stats/summary/ stats'));
      assert.equal((await get('/stats/summary//')).status, 404);
      assert.equal((await get('/metrics/resource/x')).status, 404);
    });
  });
});
