// The bounded pool of concurrent `cocoon` calls: a call's deadline counts from the call
// (time queued for a slot included), an abort while queued rejects at once and frees the
// waiter, and high-priority calls get a free slot first. A tiny shell script stands in for
// the cocoon binary: `<bin> wait <seconds> <tag>` logs `<tag>` when it starts, then sleeps.
// Deadlines run on mock timers (the test ticks them to the millisecond), and a call that
// holds the slot runs until the test stops it, so no outcome depends on the machine's speed.
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { mock, test } from 'node:test';
import { CocoonCli, CocoonCommandError } from '../../../src/cocoon/runner.ts';
import { silentLogger } from '../../../src/log.ts';

/** The real setTimeout, for polling while the test mocks the global one. */
const realSetTimeout = globalThis.setTimeout;

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

/** Waits for the fake's processes (real I/O). The bound only turns a hang into a failure:
 * a shell starts in milliseconds, 5 s is far more than 10 times that. */
async function until(cond: () => boolean, ms = 5000): Promise<void> {
  const end = performance.now() + ms;
  while (!cond()) {
    if (performance.now() > end) assert.fail('condition not met in time');
    await new Promise((r) => realSetTimeout(r, 5));
  }
}

/** Lets promise callbacks run; no mocked timer fires. */
async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) await new Promise((r) => setImmediate(r));
}

/** Follows `p` so a test can ask whether it has settled yet. */
function track<T>(p: Promise<T>): { settled: boolean; error?: unknown } {
  const s: { settled: boolean; error?: unknown } = { settled: false };
  p.then(
    () => {
      s.settled = true;
    },
    (error: unknown) => {
      s.settled = true;
      s.error = error;
    },
  );
  return s;
}

/** A call that holds a slot until `stop()` (a minute otherwise). */
function holder(c: CocoonCli): { done: Promise<unknown>; stop: () => void } {
  const ac = new AbortController();
  const done = c.run(['wait', '60', 'holder'], { timeoutMs: 120_000, signal: ac.signal }).catch((e) => e);
  return { done, stop: () => ac.abort() };
}

/** A pool of one slot, taken by a {@link holder}, with setTimeout mocked. */
async function heldPool(t: { after: (fn: () => void) => void }) {
  const fake = fakeCocoon(t);
  const c = cli(fake.bin, t);
  mock.timers.enable({ apis: ['setTimeout'] });
  t.after(() => mock.timers.reset());
  const h = holder(c);
  await until(() => fake.started().includes('holder'));
  return { fake, c, h };
}

test('a call deadline counts from the call, including the wait for a slot', async (t) => {
  const { fake, c, h } = await heldPool(t);
  const queued = c.run(['wait', '0', 'queued'], { timeoutMs: 300 });
  const q = track(queued);
  await flush();
  assert.equal(c.waiting, 1);
  mock.timers.tick(299);
  await flush();
  assert.equal(q.settled, false, 'not before its deadline');
  mock.timers.tick(1);
  await flush();
  assert.equal(q.settled, true, 'rejected at its deadline while the holder still has the slot');
  const err = q.error;
  assert.ok(err instanceof CocoonCommandError, String(err));
  assert.match(err.message, /^cocoon wait 0: deadline of 300 ms exceeded \(waited \d+ ms for a free slot\)$/);
  assert.equal(c.waiting, 0, 'the waiter left the queue');
  h.stop();
  await h.done;
  assert.deepEqual(fake.started(), ['holder'], 'the timed-out call never started');
});

test('with queueTimeoutMs the wait has its own bound and the deadline counts from the grant', async (t) => {
  const { fake, c, h } = await heldPool(t);
  // Waits well past its 300 ms run deadline for the slot, then runs with 300 ms from the grant.
  const queued = c.run(['wait', '60', 'queued'], { timeoutMs: 300, queueTimeoutMs: 1000 });
  const q = track(queued);
  // Its queue bound fires while the slot is still taken: "no free slot", never started.
  const starved = c.run(['wait', '0', 'starved'], { timeoutMs: 300, queueTimeoutMs: 600 });
  const s = track(starved);
  // An abort (a bring-up's pod deleted) still ends the long wait at once.
  const ac = new AbortController();
  const dropped = track(
    c.run(['wait', '0', 'dropped'], { timeoutMs: 300, queueTimeoutMs: 10_000, signal: ac.signal }),
  );
  await flush();
  assert.equal(c.waiting, 3);
  ac.abort();
  await flush();
  assert.equal(dropped.settled, true, 'rejected at the abort, long before its queue bound');
  assert.match(String((dropped.error as Error).message), /^cocoon wait 0: aborted \(waited \d+ ms/);
  assert.equal(c.waiting, 2);
  mock.timers.tick(599);
  await flush();
  assert.equal(q.settled, false, 'the run deadline does not count the wait');
  assert.equal(s.settled, false);
  mock.timers.tick(1);
  await flush();
  assert.equal(s.settled, true, 'rejected at its queue bound');
  assert.match(
    String((s.error as Error).message),
    /^cocoon wait 0: no free slot within 600 ms \(waited \d+ ms for a free slot\)$/,
  );
  assert.equal(q.settled, false);
  h.stop();
  await h.done;
  await until(() => fake.started().includes('queued'));
  mock.timers.tick(299);
  await flush();
  assert.equal(q.settled, false, 'not before 300 ms from the grant');
  mock.timers.tick(1);
  await until(() => q.settled);
  assert.match(String((q.error as Error).message), /^cocoon wait 60: deadline of 300 ms exceeded/);
  assert.deepEqual(fake.started(), ['holder', 'queued'], 'the starved and the dropped call never started');
});

test('an abort while queued rejects at once and frees the waiter', async (t) => {
  const fake = fakeCocoon(t);
  const c = cli(fake.bin, t);
  const h = holder(c);
  await until(() => fake.started().includes('holder'));
  const ac = new AbortController();
  const aborted = c.run(['wait', '0', 'aborted'], { timeoutMs: 10_000, signal: ac.signal });
  const next = c.run(['wait', '0', 'next'], { timeoutMs: 10_000 });
  assert.equal(c.waiting, 2);
  let holderDone = false;
  void h.done.then(() => {
    holderDone = true;
  });
  ac.abort();
  const err = await aborted.catch((e: unknown) => e);
  assert.ok(err instanceof CocoonCommandError, String(err));
  assert.match(err.message, /^cocoon wait 0: aborted \(waited \d+ ms for a free slot\)$/);
  // At once: while the holder still has the slot (it keeps it until stopped below).
  assert.equal(holderDone, false, 'rejected before the slot came free');
  assert.equal(c.waiting, 1);
  h.stop();
  await h.done;
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
  const h = holder(c);
  await until(() => fake.started().includes('holder'));
  const calls = [
    c.run(['wait', '0', 'clone-1'], { timeoutMs: 10_000 }),
    c.run(['wait', '0', 'clone-2'], { timeoutMs: 10_000, priority: 'normal' }),
    c.run(['wait', '0', 'inspect-1'], { timeoutMs: 10_000, priority: 'high' }),
    c.run(['wait', '0', 'fixup-1'], { timeoutMs: 10_000, priority: 'high' }),
  ];
  assert.equal(c.waiting, 4, 'all four queue behind the holder');
  h.stop();
  await Promise.all([h.done, ...calls]);
  assert.deepEqual(fake.started(), ['holder', 'inspect-1', 'fixup-1', 'clone-1', 'clone-2']);
});

test('a running call still dies at its deadline, counted from the call', async (t) => {
  const fake = fakeCocoon(t);
  const c = cli(fake.bin, t, 2);
  mock.timers.enable({ apis: ['setTimeout'] });
  t.after(() => mock.timers.reset());
  // It would sleep a minute: only its deadline ends it sooner.
  const r = track(c.run(['wait', '60', 'slow'], { timeoutMs: 300 }));
  await until(() => fake.started().includes('slow'));
  mock.timers.tick(299);
  await flush();
  assert.equal(r.settled, false, 'not before its deadline');
  mock.timers.tick(1);
  await until(() => r.settled); // the kill and the reap are real process I/O
  const err = r.error;
  assert.ok(err instanceof CocoonCommandError, String(err));
  assert.match(err.message, /deadline of 300 ms exceeded \(signal: killed/);
});
