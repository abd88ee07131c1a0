import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { cpuPolicy } from '../../../src/vmspec/cpu-policy.ts';

describe('cpuPolicy (pod-to-vm.md §3.1)', () => {
  it('spec examples: request 2 ⇒ 79, request 500m ⇒ 20, none ⇒ 1', () => {
    assert.equal(cpuPolicy(2000n, undefined).weight, 79);
    assert.equal(cpuPolicy(500n, undefined).weight, 20);
    assert.deepEqual(cpuPolicy(undefined, undefined), { weight: 1 });
  });

  it('uses the limit when there is no request (or a zero request)', () => {
    assert.equal(cpuPolicy(undefined, 2000n).weight, 79);
    assert.equal(cpuPolicy(0n, 2000n).weight, 79);
  });

  it('clamps shares to [2, 262144]', () => {
    assert.equal(cpuPolicy(1n, undefined).weight, 1); // shares 1 → 2
    assert.equal(cpuPolicy(256000n, undefined).weight, 10000); // shares 262144
    assert.equal(cpuPolicy(10_000_000n, undefined).weight, 10000);
  });

  it('quota only with a limit: max(L × 100, 1000) µs with period 100000', () => {
    assert.deepEqual(cpuPolicy(1000n, 2000n), { weight: 39, quotaUs: 200000n, periodUs: 100000, cpus: 2n });
    assert.deepEqual(cpuPolicy(undefined, 5n), { weight: 1, quotaUs: 1000n, periodUs: 100000, cpus: 1n });
    assert.equal(cpuPolicy(2000n, undefined).quotaUs, undefined);
    assert.equal(cpuPolicy(2000n, undefined).periodUs, undefined);
  });

  it('--cpu: ceil(limit), else ceil(request)', () => {
    assert.equal(cpuPolicy(500n, 1500n).cpus, 2n);
    assert.equal(cpuPolicy(2500n, undefined).cpus, 3n);
    assert.equal(cpuPolicy(2000n, undefined).cpus, 2n);
    assert.equal(cpuPolicy(undefined, undefined).cpus, undefined);
  });

  it('property: weight is in 1..10000 and monotonic in m', () => {
    fc.assert(
      fc.property(fc.bigInt({ min: 0n, max: 10n ** 9n }), fc.bigInt({ min: 0n, max: 10n ** 9n }), (a, b) => {
        const [lo, hi] = a <= b ? [a, b] : [b, a];
        const wl = cpuPolicy(lo, undefined).weight;
        const wh = cpuPolicy(hi, undefined).weight;
        assert.ok(wl >= 1 && wh <= 10000 && wl <= wh);
      }),
    );
  });

  it('property: matches the formula exactly', () => {
    fc.assert(
      fc.property(fc.bigInt({ min: 1n, max: 10n ** 7n }), (m) => {
        let shares = (m * 1024n) / 1000n;
        shares = shares < 2n ? 2n : shares > 262144n ? 262144n : shares;
        assert.equal(BigInt(cpuPolicy(m, undefined).weight), 1n + ((shares - 2n) * 9999n) / 262142n);
      }),
    );
  });
});
