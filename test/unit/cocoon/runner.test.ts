// The bounded pool of concurrent `cocoon` calls: a call's deadline counts from the call
// (time queued for a slot included), an abort while queued rejects at once and frees the
// waiter, and high-priority calls get a free slot first. A tiny shell script stands in for
// the cocoon binary: `<bin> wait <seconds> <tag>` logs `<tag>` when it starts, then sleeps.
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { CocoonCli, CocoonCommandError } from '../../../src/cocoon/runner.ts';
import { silentLogger } from '../../../src/log.ts';

function fakeCocoon(t: { after: (fn: () => void) => void }): { bin: string; started: () => string[] } {
  const dir = mkdtempSync(join(tmpdir(), 'vk-runner-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const log = join(dir, 'started.log');
  const bin = join(dir, 'cocoon');
  writeFileSync(log, '');
  writeFileSync(bin, `#!/bin/sh\necho "$3" >> '${log}'\nsleep "$2"\necho done\n`);
  chmodSync(bin, 0o755);
  return { bin, started: () => readFileSync(log, 'utf8').split('\n').filter(Boolean) };
}

function cli(bin: string, t: { after: (fn: () => void) => void }, maxConcurrent = 1): CocoonCli {
  const lifetime = new AbortController();
  t.after(() => lifetime.abort());
  return new CocoonCli(bin, lifetime.signal, silentLogger, { maxConcurrent });
}

async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const end = performance.now() + ms;
  while (!cond()) {
    if (performance.now() > end) assert.fail('condition not met in time');
    await sleep(5);
  }
}

test('a call deadline counts from the call, including the wait for a slot', async (t) => {
  const fake = fakeCocoon(t);
  const c = cli(fake.bin, t);
  const holder = c.run(['wait', '1.2', 'holder'], { timeoutMs: 10_000 });
  await until(() => fake.started().includes('holder'));
  const t0 = performance.now();
  const err = await c.run(['wait', '0', 'queued'], { timeoutMs: 300 }).catch((e: unknown) => e);
  const ms = performance.now() - t0;
  assert.ok(err instanceof CocoonCommandError, String(err));
  assert.match(err.message, /^cocoon wait 0: deadline of 300 ms exceeded \(waited \d+ ms for a free slot\)$/);
  assert.ok(ms >= 290 && ms < 900, `rejected after ${ms} ms (the holder runs 1200 ms)`);
  assert.equal(c.waiting, 0, 'the waiter left the queue');
  await holder;
  assert.deepEqual(fake.started(), ['holder'], 'the timed-out call never started');
});

test('an abort while queued rejects at once and frees the waiter', async (t) => {
  const fake = fakeCocoon(t);
  const c = cli(fake.bin, t);
  const holder = c.run(['wait', '0.6', 'holder'], { timeoutMs: 10_000 });
  await until(() => fake.started().includes('holder'));
  const ac = new AbortController();
  const aborted = c.run(['wait', '0', 'aborted'], { timeoutMs: 10_000, signal: ac.signal });
  const next = c.run(['wait', '0', 'next'], { timeoutMs: 10_000 });
  assert.equal(c.waiting, 2);
  await sleep(50);
  let holderDone = false;
  void holder.then(() => {
    holderDone = true;
  });
  ac.abort();
  const err = await aborted.catch((e: unknown) => e);
  assert.ok(err instanceof CocoonCommandError, String(err));
  assert.match(err.message, /^cocoon wait 0: aborted \(waited \d+ ms for a free slot\)$/);
  // At once: while the holder (0.6 s) still has the slot, not when the slot comes free.
  assert.equal(holderDone, false, 'rejected before the slot came free');
  assert.equal(c.waiting, 1);
  await holder;
  await next;
  assert.deepEqual(fake.started(), ['holder', 'next']);
  // No slot leaked: the pool still gives a call a slot at once (it never queues).
  const after = c.run(['wait', '0', 'after'], { timeoutMs: 10_000 });
  assert.equal(c.waiting, 0, 'not queued');
  await after;
});

test('waiting high-priority calls get a free slot before normal ones', async (t) => {
  const fake = fakeCocoon(t);
  const c = cli(fake.bin, t);
  const holder = c.run(['wait', '0.4', 'holder'], { timeoutMs: 10_000 });
  await until(() => fake.started().includes('holder'));
  const calls = [
    c.run(['wait', '0', 'clone-1'], { timeoutMs: 10_000 }),
    c.run(['wait', '0', 'clone-2'], { timeoutMs: 10_000, priority: 'normal' }),
    c.run(['wait', '0', 'inspect-1'], { timeoutMs: 10_000, priority: 'high' }),
    c.run(['wait', '0', 'fixup-1'], { timeoutMs: 10_000, priority: 'high' }),
  ];
  await Promise.all([holder, ...calls]);
  assert.deepEqual(fake.started(), ['holder', 'inspect-1', 'fixup-1', 'clone-1', 'clone-2']);
});

test('a running call still dies at its deadline, counted from the call', async (t) => {
  const fake = fakeCocoon(t);
  const c = cli(fake.bin, t, 2);
  const t0 = performance.now();
  const err = await c.run(['wait', '5', 'slow'], { timeoutMs: 300 }).catch((e: unknown) => e);
  assert.ok(err instanceof CocoonCommandError);
  assert.match(err.message, /deadline of 300 ms exceeded \(signal: killed/);
  assert.ok(performance.now() - t0 < 2000);
});
