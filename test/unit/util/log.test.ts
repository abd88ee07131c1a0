// src/log.ts prints what pino printed (the daemon's logger before docs/decisions.md "Daemon
// memory"): the same records, byte for byte but the time, through both, except that a key is
// written once (the test below; pino repeats a key a child or a record binds again).
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { pino } from 'pino';
import { createLogger, type Logger } from '../../../src/log.ts';

function sink(): { stream: Writable; lines: string[] } {
  const lines: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(...chunk.toString('utf8').split('\n').filter(Boolean));
      done();
    },
  });
  return { stream, lines };
}

/** pino as src/log.ts configured it. */
function pinoLogger(level: string, stream: Writable): Logger {
  return pino(
    {
      level,
      base: { component: 'vk-cocoon' },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    stream,
  ) as unknown as Logger;
}

const withCode = Object.assign(new Error('with a code'), { code: 'E1' });
const caused = new Error('outer', { cause: new TypeError('inner') });
const circular: Record<string, unknown> = { a: 1 };
circular.self = circular;

/** Calls of every shape the daemon makes, and a few it does not. */
function script(log: Logger): void {
  log.info({ pod: 'ns/p', ms: 12, ok: true, list: ['a', 1], nested: { z: [1, 2] } }, 'VM up');
  log.warn('a message alone');
  log.debug({ skipped: undefined, fn: () => 1, nan: Number.NaN, inf: Infinity, nul: null }, 'odd values');
  log.info({ text: 'quotes " and \\ and \n and → and \u2028' }, 'escapes → "too"');
  log.info({ big: 10n, date: new Date(0) }, 'bigint and date');
  log.error({ err: withCode }, 'an error object');
  log.error({ err: caused }, 'an error with a cause');
  log.info({ err: 'a string err' }, 'a string err');
  log.info({ circular }, 'a cycle');
  log.info({ msg: 'in the object', x: 1 }, 'and a message');
  log.info({ msg: 'in the object only' });
  log.info({});
  log.info({ a: 1 }, undefined);
  log.trace('below the level');
  const child = log.child({ pod: 'ns/p', vm: undefined, n: 1 });
  child.info({ vmId: 'X' }, 'from a child');
  child
    .child({ module: 'leases' })
    .warn({ pod: 'again' }, 'grandchild, a record key that differs from a binding');
  child.fatal('fatal');
}

test('the same lines as pino, call for call', () => {
  const ours = sink();
  const theirs = sink();
  script(createLogger('debug', ours.stream));
  script(pinoLogger('debug', theirs.stream));
  const untimed = (l: string) => l.replace(/"time":"[^"]*"/, '"time":"T"');
  assert.equal(ours.lines.length, 16);
  assert.deepEqual(ours.lines.map(untimed), theirs.lines.map(untimed));
  for (const l of ours.lines)
    assert.match(
      l,
      /^\{"level":"\w+","time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z","component":"vk-cocoon"/,
    );
});

test('a key is written once: a child rebinding a key replaces it in place; a record repeating a binding drops the copy', () => {
  // pino writes both copies (`"pod":"ns/p",...,"pod":"dup"`); the daemon's VM-scoped loggers
  // bind vmId and its records repeat it, so the lines carried `"vmId"` twice.
  const out = sink();
  const log = createLogger('info', out.stream).child({ pod: 'ns/p', vmId: 'A' });
  log.child({ module: 'leases', pod: 'dup' }).warn({ x: 1 }, 'rebound');
  log.info({ vmId: 'A', ms: 3 }, 'repeated');
  log.info({ vmId: 'B' }, 'differs');
  const records = out.lines.map((l) => l.replace(/"time":"[^"]*"/, '"time":"T"'));
  assert.deepEqual(records, [
    '{"level":"warn","time":"T","component":"vk-cocoon","pod":"dup","vmId":"A","module":"leases","x":1,"msg":"rebound"}',
    '{"level":"info","time":"T","component":"vk-cocoon","pod":"ns/p","vmId":"A","ms":3,"msg":"repeated"}',
    '{"level":"info","time":"T","component":"vk-cocoon","pod":"ns/p","vmId":"A","vmId":"B","msg":"differs"}',
  ]);
  assert.equal(JSON.parse(records[2] as string).vmId, 'B', 'a differing record value wins, as in pino');
});

test('levels: below the configured level nothing is written; silent writes nothing', () => {
  const out = sink();
  const log = createLogger('warn', out.stream);
  log.info('no');
  log.debug({ a: 1 }, 'no');
  log.warn('yes');
  log.child({ a: 1 }).error('yes too');
  assert.equal(out.lines.length, 2);
  assert.equal(log.isLevelEnabled('info'), false);
  assert.equal(log.isLevelEnabled('error'), true);
  const quiet = sink();
  const silent = createLogger('silent', quiet.stream);
  silent.fatal('no');
  assert.equal(quiet.lines.length, 0);
  assert.equal(silent.isLevelEnabled('fatal'), false);
  assert.throws(() => createLogger('loud', out.stream), /unknown level/);
});
