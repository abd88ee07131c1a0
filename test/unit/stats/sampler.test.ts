import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdir, truncate } from 'node:fs/promises';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, it } from 'node:test';
import { backendDir, StatsSampler } from '../../../src/stats/sampler.ts';
import type { TrackedVm } from '../../../src/stats/types.ts';
import { type FakeHost, fakeHost, MEMINFO, procStat, vm } from './fake-host.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('stats/sampler', () => {
  let host: FakeHost;
  beforeEach(async () => {
    host = await fakeHost();
  });
  afterEach(async () => {
    await host.cleanup();
  });

  function clock(start = 1_780_000_000_000) {
    let t = start;
    return {
      now: () => t,
      advance: (ms: number) => {
        t += ms;
      },
    };
  }

  describe('backendDir', () => {
    it('maps firecracker to firecracker and anything else to cloudhypervisor', () => {
      assert.equal(backendDir('firecracker'), 'firecracker');
      assert.equal(backendDir('cloud-hypervisor'), 'cloudhypervisor');
      assert.equal(backendDir(''), 'cloudhypervisor');
    });
  });

  describe('StatsSampler', () => {
    it('reads cgroup CPU, RSS, COW size, TAP counters and node figures', async () => {
      const v = vm({ tap: 'tapJ7QX4MZK-0' });
      await host.cpuStat(v.vmId, 2_500_000, 7, 300_000);
      await host.procStatus(v.pid, 524288);
      const run = `root/run/cloudhypervisor/${v.vmId}`;
      await host.write(`${run}/overlay.qcow2`, randomBytes(64 * 1024));
      await host.write(`${run}/cow.raw`, randomBytes(256 * 1024));
      await host.write('sysnet/tapJ7QX4MZK-0/statistics/rx_bytes', '1000\n');
      await host.write('sysnet/tapJ7QX4MZK-0/statistics/tx_bytes', '5000\n');
      await host.write('proc/stat', procStat(3000, 1000, 50000, 700, 100));
      await host.write('proc/meminfo', MEMINFO);

      const s = await new StatsSampler(() => [v], host.config).sample();
      assert.equal(s.vms.length, 1);
      const x = s.vms[0]!;
      assert.equal(x.vm, v);
      assert.equal(x.cpuSource, 'cgroup');
      assert.equal(x.cpuUsageUsec, 2_500_000);
      assert.equal(x.throttledPeriods, 7);
      assert.equal(x.throttledUsec, 300_000);
      assert.equal(x.rssBytes, 524288 * 1024);
      // overlay.qcow2 wins over cow.raw; allocated bytes of a dense 64 KiB file.
      assert.ok(x.cowBytes >= 64 * 1024 && x.cowBytes < 256 * 1024, `cowBytes ${x.cowBytes}`);
      // Guest view: the TAP's tx is what the guest received.
      assert.equal(x.rxBytes, 5000);
      assert.equal(x.txBytes, 1000);
      assert.deepEqual(x.interfaces, [{ name: 'tapJ7QX4MZK-0', rxBytes: 5000, txBytes: 1000 }]);
      assert.equal(x.prevCpu, undefined);

      // busy = user + system + steal = 4100 ticks = 41 s.
      assert.equal(s.node.cpuUsageUsec, 41_000_000);
      assert.equal(s.node.memoryTotalBytes, 16_000_000 * 1024);
      assert.equal(s.node.memoryUsedBytes, 10_000_000 * 1024);
      assert.equal(s.node.memoryUsageBytes, 14_000_000 * 1024);
      assert.equal(s.node.memoryRssBytes, 7_000_000 * 1024);
      assert.ok(s.node.storageTotalBytes > 0);
      assert.ok(s.node.storageAvailableBytes > 0 && s.node.storageAvailableBytes <= s.node.storageTotalBytes);
    });

    it('yields zeros for missing files and a dead pid, never throwing', async () => {
      const dead = vm({ pid: 999_999_999, tap: ['tap-a', 'tap-b'] });
      const never = vm({ vmId: 'NOPID', pid: 0, pod: 'p1' });
      host.config.rootDir = join(host.dir, 'does-not-exist');
      const s = await new StatsSampler(() => [dead, never], host.config).sample();
      for (const x of s.vms) {
        assert.equal(x.cpuSource, 'none');
        assert.equal(x.cpuUsageUsec, 0);
        assert.equal(x.throttledUsec, 0);
        assert.equal(x.throttledPeriods, 0);
        assert.equal(x.rssBytes, 0);
        assert.equal(x.cowBytes, 0);
        assert.equal(x.rxBytes, 0);
        assert.equal(x.txBytes, 0);
      }
      assert.deepEqual(
        s.vms[0]!.interfaces.map((i) => i.name),
        ['tap-a', 'tap-b'],
      );
      assert.deepEqual(
        { ...s.node },
        {
          cpuUsageUsec: 0,
          memoryTotalBytes: 0,
          memoryAvailableBytes: 0,
          memoryUsedBytes: 0,
          memoryUsageBytes: 0,
          memoryRssBytes: 0,
          storageTotalBytes: 0,
          storageAvailableBytes: 0,
        },
      );
    });

    it('falls back to /proc/<pid>/stat CPU, statm RSS and /proc/<pid>/net/dev', async () => {
      const v = vm({ backend: 'firecracker', pid: 4242, tap: 'tapX-0' });
      // comm with spaces and a parenthesis; utime 150, stime 50, cutime 30, cstime 20 ticks.
      const fields = [
        'S',
        '1',
        '4242',
        '4242',
        '0',
        '-1',
        '0',
        '10',
        '0',
        '0',
        '0',
        '150',
        '50',
        '30',
        '20',
        '20',
      ];
      await host.write('proc/4242/stat', `4242 (fire (cracker) x) ${fields.join(' ')} 0 1 0 12345\n`);
      await host.write('proc/4242/status', 'Name:\tfirecracker\nState:\tZ (zombie)\n');
      await host.write('proc/4242/statm', '1000 256 100 10 0 200 0\n');
      await host.write(
        'proc/4242/net/dev',
        'Inter-|   Receive                                                |  Transmit\n' +
          ' face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n' +
          '    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n' +
          '  tapX-0:  700     7    0    0    0     0          0         0     9000      9    0    0    0     0       0          0\n',
      );
      const run = `root/run/firecracker/${v.vmId}`;
      await host.write(`${run}/cow.raw`, randomBytes(8192));
      const x = (await new StatsSampler(() => [v], host.config).sample()).vms[0]!;
      assert.equal(x.cpuSource, 'proc');
      assert.equal(x.cpuUsageUsec, 2_500_000);
      assert.equal(x.throttledPeriods, 0);
      assert.equal(x.rssBytes, 256 * 4096);
      assert.ok(x.cowBytes >= 8192, `cowBytes ${x.cowBytes}`);
      assert.equal(x.rxBytes, 9000);
      assert.equal(x.txBytes, 700);
    });

    it('reports allocated bytes of a sparse COW file, not its apparent size', async () => {
      const v = vm();
      const run = join(host.config.rootDir, 'run', 'cloudhypervisor', v.vmId);
      await mkdir(run, { recursive: true });
      await host.write(`root/run/cloudhypervisor/${v.vmId}/cow.raw`, '');
      await truncate(join(run, 'cow.raw'), 1024 ** 3);
      const x = (await new StatsSampler(() => [v], host.config).sample()).vms[0]!;
      assert.ok(x.cowBytes < 1024 ** 3 / 2, `cowBytes ${x.cowBytes}`);
    });

    it('reads a live process from the real /proc', async () => {
      const self = vm({ pid: process.pid });
      const config = { ...host.config };
      delete config.procRoot;
      const x = (await new StatsSampler(() => [self], config).sample()).vms[0]!;
      assert.equal(x.cpuSource, 'proc');
      assert.ok(x.cpuUsageUsec > 0);
      assert.ok(x.rssBytes > 1024 * 1024);
    });

    it('shares one sample for 2 s and between concurrent callers', async () => {
      const c = clock();
      let lists = 0;
      const v = vm();
      await host.cpuStat(v.vmId, 1_000_000);
      const sampler = new StatsSampler(
        () => {
          lists++;
          return [v];
        },
        { ...host.config, now: c.now },
      );
      assert.equal(sampler.latest(), undefined);
      const [a, b] = await Promise.all([sampler.sample(), sampler.sample()]);
      assert.equal(a, b);
      assert.equal(lists, 1);
      c.advance(1999);
      assert.equal(await sampler.sample(), a);
      assert.equal(lists, 1);
      c.advance(1);
      await host.cpuStat(v.vmId, 1_500_000);
      const d = await sampler.sample();
      assert.notEqual(d, a);
      assert.equal(lists, 2);
      assert.equal(sampler.latest(), d);
      assert.deepEqual(d.vms[0]!.prevCpu, { timeMs: a.timeMs, usageUsec: 1_000_000 });
      assert.equal(d.timeMs - a.timeMs, 2000);
    });

    it('honours a custom minimum interval', async () => {
      const c = clock();
      let lists = 0;
      const sampler = new StatsSampler(
        () => {
          lists++;
          return [];
        },
        { ...host.config, now: c.now, minIntervalMs: 0 },
      );
      await sampler.sample();
      await sampler.sample();
      assert.equal(lists, 2);
    });

    it('drops the previous CPU reading across a hypervisor restart or counter reset', async () => {
      const c = clock();
      let vms: TrackedVm[] = [
        vm({ pid: 10 }),
        vm({ vmId: 'B', pid: 20, pod: 'b' }),
        vm({ vmId: 'C', pid: 30, pod: 'c' }),
      ];
      await host.cpuStat(vms[0]!.vmId, 5_000_000);
      await host.cpuStat('B', 5_000_000);
      await host.cpuStat('C', 5_000_000);
      await host.write('proc/stat', procStat(100, 100, 100));
      const sampler = new StatsSampler(() => vms, { ...host.config, now: c.now });
      await sampler.sample();
      c.advance(5000);
      await host.cpuStat('B', 1_000); // counter went backwards
      await host.write('proc/stat', procStat(200, 100, 100));
      vms = [vm({ pid: 11 }), vms[1]!, vms[2]!]; // first VM: new pid
      const s = await sampler.sample();
      assert.equal(s.vms[0]!.prevCpu, undefined);
      assert.equal(s.vms[1]!.prevCpu, undefined);
      assert.deepEqual(s.vms[2]!.prevCpu, { timeMs: s.timeMs - 5000, usageUsec: 5_000_000 });
      assert.deepEqual(s.node.prevCpu, { timeMs: s.timeMs - 5000, usageUsec: 2_000_000 });
      assert.equal(s.node.cpuUsageUsec, 3_000_000);
      // A VM that disappears and comes back has no stale previous reading.
      c.advance(5000);
      vms = [];
      await sampler.sample();
      c.advance(5000);
      vms = [vm({ vmId: 'C', pid: 30, pod: 'c' })];
      assert.equal((await sampler.sample()).vms[0]!.prevCpu, undefined);
    });

    it('treats a failing VM listing as no VMs', async () => {
      const sampler = new StatsSampler(() => {
        throw new Error('tracker unavailable');
      }, host.config);
      const s = await sampler.sample();
      assert.deepEqual(s.vms, []);
      const rejecting = new StatsSampler(() => Promise.reject(new Error('later')), host.config);
      assert.deepEqual((await rejecting.sample()).vms, []);
    });
  });
});
