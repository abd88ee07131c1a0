import assert from 'node:assert/strict';
import { createServer, request } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { createMetrics } from '../../../src/metrics/registry.ts';
import { applySample, attachSampler } from '../../../src/stats/collect.ts';
import { statsRoutes } from '../../../src/stats/routes.ts';
import { StatsSampler } from '../../../src/stats/sampler.ts';
import type { Sample, TrackedVm } from '../../../src/stats/types.ts';
import { parsePromText } from '../metrics/prom-text.ts';
import { type FakeHost, fakeHost, MEMINFO, procStat, vm } from './fake-host.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('stats/collect', () => {
  let host: FakeHost;
  beforeEach(async () => {
    host = await fakeHost();
    await host.write('proc/stat', procStat(3000, 1000, 50000));
    await host.write('proc/meminfo', MEMINFO);
  });
  afterEach(async () => {
    await host.cleanup();
  });

  function value(text: ReturnType<typeof parsePromText>, name: string, labels: Record<string, string> = {}) {
    return text.samples.find(
      (s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v),
    )?.value;
  }

  describe('collect hook', () => {
    it('sets the per-VM and node families from the shared sample', async () => {
      const v = vm({ tap: 'tap0', backend: 'firecracker' });
      await host.cpuStat(v.vmId, 2_500_000, 7, 300_000);
      await host.procStatus(v.pid, 1024);
      await host.write(`root/run/firecracker/${v.vmId}/cow.raw`, Buffer.alloc(16384, 1));
      await host.write('sysnet/tap0/statistics/rx_bytes', '10');
      await host.write('sysnet/tap0/statistics/tx_bytes', '20');
      const metrics = createMetrics();
      const sampler = new StatsSampler(() => [v], host.config);
      attachSampler(metrics, sampler);
      const text = parsePromText(await metrics.render());
      const l = { vm: 'vk-team-a-agent-0', pod: 'agent-0', namespace: 'team-a', backend: 'firecracker' };
      assert.equal(value(text, 'cocoon_vk_vm_cpu_seconds_total', l), 2.5);
      assert.equal(value(text, 'cocoon_vk_vm_cpu_throttled_seconds_total', l), 0.3);
      assert.equal(value(text, 'cocoon_vk_vm_cpu_throttled_periods_total', l), 7);
      assert.equal(value(text, 'cocoon_vk_vm_memory_rss_bytes', l), 1024 * 1024);
      assert.ok((value(text, 'cocoon_vk_vm_disk_cow_bytes', l) ?? 0) >= 16384);
      assert.equal(value(text, 'cocoon_vk_vm_network_rx_bytes_total', l), 20);
      assert.equal(value(text, 'cocoon_vk_vm_network_tx_bytes_total', l), 10);
      assert.equal(value(text, 'cocoon_vk_vm_cpu_source', { source: 'cgroup' }), 1, 'read from its scope');
      assert.equal(value(text, 'cocoon_vk_vm_cpu_source', { source: 'proc' }), 0);
      assert.equal(value(text, 'cocoon_vk_node_cpu_seconds_total'), 40);
      assert.equal(value(text, 'cocoon_vk_node_memory_used_bytes'), 10_000_000 * 1024);
      assert.ok((value(text, 'cocoon_vk_node_storage_total_bytes') ?? 0) > 0);
      assert.ok((value(text, 'cocoon_vk_node_storage_available_bytes') ?? 0) > 0);
    });

    it('takes one sample per scrape and forgets VMs no longer tracked', async () => {
      let vms: TrackedVm[] = [vm(), vm({ vmId: 'B', vmName: 'vk-b', pod: 'b' })];
      let lists = 0;
      const metrics = createMetrics();
      attachSampler(
        metrics,
        new StatsSampler(
          () => {
            lists++;
            return vms;
          },
          { ...host.config, minIntervalMs: 0 },
        ),
      );
      const first = parsePromText(await metrics.render());
      assert.equal(lists, 1);
      assert.equal(first.samples.filter((s) => s.name === 'cocoon_vk_vm_memory_rss_bytes').length, 2);
      vms = [vms[1]!];
      const second = parsePromText(await metrics.render());
      assert.equal(lists, 2);
      const rss = second.samples.filter((s) => s.name === 'cocoon_vk_vm_memory_rss_bytes');
      assert.deepEqual(
        rss.map((s) => s.labels.vm),
        ['vk-b'],
      );
      assert.equal(second.samples.filter((s) => s.name === 'cocoon_vk_vm_cpu_seconds_total').length, 1);
    });

    it('without per-VM labels (VK_METRICS_VM_LABELS=false) sums per namespace and backend and names no VM', async () => {
      const a = vm({ vmId: 'A', vmName: 'vk-team-a-secret-a', pod: 'secret-a', pid: 101 });
      const b = vm({ vmId: 'B', vmName: 'vk-team-a-secret-b', pod: 'secret-b', pid: 102 });
      const c = vm({ vmId: 'C', vmName: 'vk-team-b-other', pod: 'other', namespace: 'team-b', pid: 103 });
      await host.cpuStat('A', 1_000_000);
      await host.cpuStat('B', 2_000_000);
      await host.cpuStat('C', 4_000_000);
      await host.procStatus(101, 1024);
      await host.procStatus(102, 2048);
      await host.procStatus(103, 4096);
      const on = createMetrics();
      const off = createMetrics({ vmLabels: false });
      attachSampler(on, new StatsSampler(() => [a, b, c], host.config));
      attachSampler(off, new StatsSampler(() => [a, b, c], host.config));
      const withNames = await on.render();
      assert.match(withNames, /vk-team-a-secret-a/, 'the default keeps the per-VM series');
      const raw = await off.render();
      assert.doesNotMatch(raw, /secret-|vk-team|other|pod=|vm=/);
      const text = parsePromText(raw);
      const teamA = { namespace: 'team-a', backend: 'cloud-hypervisor' };
      assert.equal(value(text, 'cocoon_vk_vm_cpu_seconds_total', teamA), 3);
      assert.equal(value(text, 'cocoon_vk_vm_memory_rss_bytes', teamA), 3072 * 1024);
      assert.equal(value(text, 'cocoon_vk_vm_cpu_seconds_total', { namespace: 'team-b' }), 4);
      for (const name of ['cocoon_vk_vm_cpu_seconds_total', 'cocoon_vk_vm_memory_rss_bytes']) {
        const samples = text.samples.filter((s) => s.name === name);
        assert.equal(samples.length, 2, `${name}: one series per namespace and backend`);
        for (const s of samples) assert.deepEqual(Object.keys(s.labels).sort(), ['backend', 'namespace']);
      }
      // A second scrape replaces the sums instead of adding to them.
      const again = parsePromText(await off.render());
      assert.equal(value(again, 'cocoon_vk_vm_memory_rss_bytes', teamA), 3072 * 1024);
    });

    it('applySample replaces, not accumulates, counter values', async () => {
      const metrics = createMetrics();
      const base: Sample = {
        timeMs: 0,
        node: {
          cpuUsageUsec: 5_000_000,
          memoryTotalBytes: 0,
          memoryAvailableBytes: 0,
          memoryUsedBytes: 0,
          memoryUsageBytes: 0,
          memoryRssBytes: 0,
          storageTotalBytes: 0,
          storageAvailableBytes: 0,
        },
        vms: [],
      };
      applySample(metrics, base);
      applySample(metrics, { ...base, node: { ...base.node, cpuUsageUsec: 6_000_000 } });
      const text = parsePromText(await metrics.render());
      assert.equal(value(text, 'cocoon_vk_node_cpu_seconds_total'), 6);
    });
  });

  describe('statsRoutes', () => {
    let server: ReturnType<typeof createServer>;
    let port: number;
    const get = (path: string) =>
      new Promise<{ status: number; type: string | undefined; body: string }>((resolve, reject) => {
        const req = request({ host: '127.0.0.1', port, path, agent: false }, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => {
            body += c;
          });
          res.on('end', () =>
            resolve({ status: res.statusCode ?? 0, type: res.headers['content-type'], body }),
          );
        });
        req.on('error', reject);
        req.end();
      });

    beforeEach(async () => {
      const v = vm();
      await host.cpuStat(v.vmId, 1_000_000);
      await host.procStatus(v.pid, 2048);
      const routes = statsRoutes(new StatsSampler(() => [v], host.config), 'cocoon-pool', new Date(0));
      assert.deepEqual(Object.keys(routes).sort(), [
        '/metrics/resource',
        '/metrics/resource/',
        '/stats/summary',
        '/stats/summary/',
      ]);
      server = createServer((req, res) => {
        const h = routes[new URL(req.url ?? '/', 'http://x').pathname];
        if (h) void h(req, res);
        else res.writeHead(404).end();
      });
      await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
      port = (server.address() as AddressInfo).port;
    });
    afterEach(async () => {
      await new Promise<void>((r) => server.close(() => r()));
    });

    it('serves /stats/summary as JSON', async () => {
      const r = await get('/stats/summary');
      assert.equal(r.status, 200);
      assert.equal(r.type, 'application/json');
      const s = JSON.parse(r.body);
      assert.equal(s.node.nodeName, 'cocoon-pool');
      assert.equal(s.pods[0].containers[0].name, 'agent');
      assert.equal(s.pods[0].containers[0].memory.workingSetBytes, 2048 * 1024);
      assert.equal(s.pods[0].cpu.usageCoreNanoSeconds, 1_000_000_000);
    });

    it('serves /metrics/resource as Prometheus text 0.0.4', async () => {
      const r = await get('/metrics/resource');
      assert.equal(r.status, 200);
      assert.equal(r.type, 'text/plain; version=0.0.4');
      const text = parsePromText(r.body);
      assert.equal(value(text, 'container_cpu_usage_seconds_total', { pod: 'agent-0' }), 1);
      assert.ok(text.samples.every((s) => s.timestampMs !== undefined));
    });
  });
});
