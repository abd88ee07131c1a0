import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { PassThrough } from 'node:stream';
import { test } from 'node:test';
import { FOLLOW_SLOTS, LogFollower } from '../../../src/provider/cocoon/log-follow.ts';
import { newLogLines } from '../../../src/provider/cocoon/provider.ts';

test('new log lines after the previous tail', () => {
  assert.deepEqual(newLogLines(['a', 'b', 'c'], ['a', 'b', 'c', 'd', 'e']), ['d', 'e']);
  assert.deepEqual(newLogLines(['b', 'c'], ['x', 'a', 'b', 'c', 'd']), ['d']);
  assert.deepEqual(newLogLines(['a', 'b'], ['a', 'b']), []);
});

test('repeated lines anchor on the latest occurrence', () => {
  assert.deepEqual(newLogLines(['x', 'tick'], ['x', 'tick', 'y', 'x', 'tick', 'z']), ['z']);
});

test('no anchor (rotation) emits everything; no previous emits everything', () => {
  assert.deepEqual(newLogLines(['old'], ['n1', 'n2']), ['n1', 'n2']);
  assert.deepEqual(newLogLines([], ['n1']), ['n1']);
});

// The follow lane (log-follow.ts): polls are streaming children in a bounded lane of their
// own, never calls of the shared cocoon pool.

/** A fake `cocoon vm logs` child the test finishes by hand. */
function fakeSpawner() {
  const children: { argv: readonly string[]; finish: (text: string) => void }[] = [];
  let running = 0;
  let peak = 0;
  const spawner = {
    spawn(argv: readonly string[]) {
      const child = new EventEmitter() as EventEmitter & { stdout: PassThrough; stderr: PassThrough };
      child.stdout = new PassThrough();
      child.stderr = new PassThrough();
      running++;
      peak = Math.max(peak, running);
      children.push({
        argv,
        finish: (text) => {
          running--;
          child.stdout.end(text);
          setImmediate(() => child.emit('close', 0));
        },
      });
      return child as never;
    },
  };
  return { spawner, children, peak: () => peak };
}

test('ten followers never run more than FOLLOW_SLOTS polls at once; each gets its tail', async () => {
  const f = fakeSpawner();
  const follower = new LogFollower(f.spawner);
  const ac = new AbortController();
  const outs = Array.from({ length: 10 }, (_, i) => {
    const out = new PassThrough();
    follower.follow(`VM${i}`, i % 2 === 0 ? 'ns-a' : 'ns-b', 5, out, ac.signal);
    return out;
  });
  const tick = () => new Promise((r) => setImmediate(r));
  await tick();
  assert.equal(f.children.length, FOLLOW_SLOTS, 'the rest wait for the lane');
  assert.equal(follower.waiting, 10 - FOLLOW_SLOTS);
  // Finish polls one at a time: each frees the lane for the next follower.
  for (let done = 0; done < 10; done++) {
    const c = f.children[done];
    assert.ok(c, `poll ${done} started`);
    c.finish(`line of ${c.argv.at(-1)}\n`);
    while (f.children.length < Math.min(10, done + 1 + FOLLOW_SLOTS)) await tick();
  }
  assert.equal(f.peak(), FOLLOW_SLOTS);
  while (outs.some((o) => o.readableLength === 0)) await tick();
  const firstChunk = outs.map((o) => String(o.read() ?? ''));
  assert.ok(
    firstChunk.every((t) => /^line of VM\d\n$/.test(t)),
    JSON.stringify(firstChunk),
  );
  ac.abort();
});
