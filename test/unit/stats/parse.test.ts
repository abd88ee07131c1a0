import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  nodeMemory,
  parseCpuStat,
  parseMeminfo,
  parseNetDev,
  parsePidStatCpuUsec,
  parseProcStatCpuUsec,
  parseStatmRss,
  parseStatusRss,
} from '../../../src/stats/parse.ts';

describe('kernel file parsers', () => {
  it('parses cgroup v2 cpu.stat', () => {
    assert.deepEqual(
      parseCpuStat(
        'usage_usec 123\nuser_usec 100\nsystem_usec 23\nnr_periods 9\nnr_throttled 4\nthrottled_usec 77\n',
      ),
      { usageUsec: 123, throttledPeriods: 4, throttledUsec: 77 },
    );
    assert.deepEqual(parseCpuStat(''), { usageUsec: 0, throttledPeriods: 0, throttledUsec: 0 });
    assert.deepEqual(parseCpuStat('usage_usec garbage\n'), {
      usageUsec: 0,
      throttledPeriods: 0,
      throttledUsec: 0,
    });
  });

  it('parses VmRSS and statm', () => {
    assert.equal(parseStatusRss('Name:\tx\nVmHWM:\t  900 kB\nVmRSS:\t  512 kB\n'), 512 * 1024);
    assert.equal(parseStatusRss('Name:\tkthreadd\n'), undefined);
    assert.equal(parseStatmRss('100 25 3 1 0 10 0'), 25 * 4096);
    assert.equal(parseStatmRss('100 25 3', 16384), 25 * 16384);
    assert.equal(parseStatmRss(''), 0);
  });

  it('parses /proc/<pid>/stat CPU whatever the command name contains', () => {
    fc.assert(
      fc.property(
        fc.string({ maxLength: 16 }),
        fc.array(fc.nat({ max: 1e7 }), { minLength: 4, maxLength: 4 }),
        (comm, [u, s, cu, cs]) => {
          const f = ['R', '1', '1', '1', '0', '-1', '0', '0', '0', '0', '0', u, s, cu, cs, '20', '0', '1'];
          const usec = parsePidStatCpuUsec(`77 (${comm}) ${f.join(' ')}\n`);
          assert.equal(usec, ((u ?? 0) + (s ?? 0) + (cu ?? 0) + (cs ?? 0)) * 10_000);
        },
      ),
      { numRuns: 200 },
    );
    assert.equal(parsePidStatCpuUsec('garbage'), 0);
    assert.equal(parsePidStatCpuUsec(''), 0);
  });

  it('parses the /proc/stat cpu line as busy time', () => {
    // user nice system idle iowait irq softirq steal guest guest_nice
    assert.equal(
      parseProcStatCpuUsec('cpu  10 20 30 1000 500 4 5 6 3 0\ncpu0 1 1 1 1 1 1 1 1 1 1\n'),
      75 * 10_000,
    );
    assert.equal(parseProcStatCpuUsec('cpu  10 20 30 1000\n'), 60 * 10_000);
    assert.equal(parseProcStatCpuUsec('intr 1\n'), 0);
    assert.equal(parseProcStatCpuUsec(''), 0);
  });

  it('derives node memory from meminfo', () => {
    const m = parseMeminfo(
      'MemTotal: 1000 kB\nMemFree: 100 kB\nMemAvailable: 400 kB\nAnonPages: 300 kB\nHugePages_Total: 4\n',
    );
    assert.equal(m.get('HugePages_Total'), 4);
    assert.deepEqual(nodeMemory(m), {
      totalBytes: 1000 * 1024,
      availableBytes: 400 * 1024,
      usedBytes: 600 * 1024,
      usageBytes: 900 * 1024,
      rssBytes: 300 * 1024,
    });
    // Without MemAvailable (old kernels): free + buffers + cached.
    const old = nodeMemory(
      parseMeminfo('MemTotal: 1000 kB\nMemFree: 100 kB\nBuffers: 50 kB\nCached: 150 kB\n'),
    );
    assert.equal(old.usedBytes, 700 * 1024);
    assert.deepEqual(nodeMemory(new Map()), {
      totalBytes: 0,
      availableBytes: 0,
      usedBytes: 0,
      usageBytes: 0,
      rssBytes: 0,
    });
  });

  it('parses /proc/net/dev', () => {
    const text =
      'Inter-|   Receive                                                |  Transmit\n' +
      ' face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n' +
      '    lo:  1234  10    0    0    0     0          0         0     1234      10    0    0    0     0       0          0\n' +
      'tap0:5 1 0 0 0 0 0 0 6 1 0 0 0 0 0 0\n' +
      'short: 1 2 3\n';
    const m = parseNetDev(text);
    assert.deepEqual(m.get('lo'), { rxBytes: 1234, txBytes: 1234 });
    assert.deepEqual(m.get('tap0'), { rxBytes: 5, txBytes: 6 });
    assert.equal(m.has('short'), false);
    assert.equal(m.size, 2);
  });
});
