// The ICMP prober (src/net/icmp.ts): fping's output parsed per line, probes batched into one
// run, results as each line arrives, failed runs answering false, the host check. fping is
// replaced by a scripted child here; test/integration/probes.test.ts runs the real one.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { PassThrough, Writable } from 'node:stream';
import { describe, test } from 'node:test';
import { createLogger, silentLogger as log } from '../../../src/log.ts';
import {
  BATCH_WINDOW_MS,
  fpingArgs,
  IcmpProber,
  icmpUnavailable,
  MAX_BATCH,
  MAX_RUNS,
  parseFpingLine,
  READY_WINDOW_MS,
  type Spawner,
} from '../../../src/net/icmp.ts';

class FakeChild extends EventEmitter {
  stdout = new PassThrough();
  stderr = new PassThrough();
  killed: string | undefined;
  readonly args: readonly string[];
  constructor(args: readonly string[]) {
    super();
    this.args = args;
  }
  kill(signal?: NodeJS.Signals): boolean {
    this.killed = signal ?? 'SIGTERM';
    this.exit(null);
    return true;
  }
  say(line: string): void {
    this.stdout.write(`${line}\n`);
  }
  exit(code: number | null): void {
    this.stdout.end();
    this.stderr.end();
    setImmediate(() => this.emit('close', code));
  }
  /** The addresses of this run (after fping's options). */
  get ips(): string[] {
    return this.args.slice(this.args.indexOf('1') + 1);
  }
}

function fakeSpawn() {
  const runs: FakeChild[] = [];
  const spawn: Spawner = (cmd, args) => {
    assert.equal(cmd, 'fping');
    const c = new FakeChild(args);
    runs.push(c);
    return c;
  };
  return { runs, spawn };
}

const tick = () => new Promise((r) => setImmediate(r));

describe('parseFpingLine', () => {
  test('alive and unreachable lines', () => {
    assert.deepEqual(parseFpingLine('198.18.0.10 is alive'), { ip: '198.18.0.10', alive: true });
    assert.deepEqual(parseFpingLine('198.18.0.10 is alive (0.05 ms)'), { ip: '198.18.0.10', alive: true });
    assert.deepEqual(parseFpingLine('198.18.0.11 is unreachable'), { ip: '198.18.0.11', alive: false });
  });
  test('anything else is not a result', () => {
    assert.equal(
      parseFpingLine('ICMP Host Unreachable from 198.18.0.1 for ICMP Echo sent to 198.18.0.11'),
      undefined,
    );
    assert.equal(parseFpingLine('example.com is alive'), undefined);
    assert.equal(parseFpingLine(''), undefined);
  });
});

test('fpingArgs: IPv4, one echo, the timeout, addresses last', () => {
  assert.deepEqual(fpingArgs(['10.0.0.1', '10.0.0.2'], 3000), [
    '-4',
    '-r',
    '0',
    '-t',
    '3000',
    '-i',
    '1',
    '10.0.0.1',
    '10.0.0.2',
  ]);
});

describe('IcmpProber', () => {
  test('probes within the batch window share one run; each resolves on its own line', async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    {
      const { runs, spawn } = fakeSpawn();
      const p = new IcmpProber({ timeoutMs: 3000, log, spawn });
      const a = p.probe('198.18.0.10');
      const b = p.probe('198.18.0.11');
      const a2 = p.probe('198.18.0.10'); // the same address twice: one echo
      assert.equal(runs.length, 0, 'nothing runs before the window closes');
      t.mock.timers.tick(BATCH_WINDOW_MS);
      assert.equal(runs.length, 1);
      assert.deepEqual(runs[0]?.ips, ['198.18.0.10', '198.18.0.11']);
      let bDone = false;
      void b.then(() => {
        bDone = true;
      });
      runs[0]?.say('198.18.0.10 is alive');
      assert.equal(await a, true, 'known as soon as its line arrives');
      assert.equal(await a2, true);
      await tick();
      assert.equal(bDone, false, 'the other address still waits for its timeout');
      runs[0]?.say('198.18.0.11 is unreachable');
      runs[0]?.exit(1);
      assert.equal(await b, false);
    }
  });

  test('a ready probe waits up to its window for company; an urgent one brings the run forward', async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const { runs, spawn } = fakeSpawn();
    const p = new IcmpProber({ timeoutMs: 3000, log, spawn });
    void p.probe('198.18.0.10', READY_WINDOW_MS);
    t.mock.timers.tick(READY_WINDOW_MS - 1);
    assert.equal(runs.length, 0, 'still waiting for others');
    t.mock.timers.tick(1);
    assert.equal(runs.length, 1);
    void p.probe('198.18.0.11', READY_WINDOW_MS);
    t.mock.timers.tick(100);
    void p.probe('198.18.0.12'); // a pod coming up: 10 ms at most
    t.mock.timers.tick(BATCH_WINDOW_MS);
    assert.equal(runs.length, 2, 'the urgent deadline ran the batch');
    assert.deepEqual(runs[1]?.ips, ['198.18.0.11', '198.18.0.12']);
    t.mock.timers.tick(READY_WINDOW_MS);
    assert.equal(runs.length, 2, 'no second run for the same batch');
  });

  test('a full batch runs at once; at most MAX_RUNS runs, the rest wait', async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    {
      const { runs, spawn } = fakeSpawn();
      const p = new IcmpProber({ timeoutMs: 3000, log, spawn });
      const all: Promise<boolean>[] = [];
      for (let i = 0; i < MAX_BATCH * (MAX_RUNS + 1); i++)
        all.push(p.probe(`10.${i >> 16}.${(i >> 8) & 255}.${i & 255}`));
      assert.equal(runs.length, MAX_RUNS, 'full batches start without the window');
      for (const r of runs) assert.equal(r.ips.length, MAX_BATCH);
      runs[0]?.exit(0); // no line for any address: all count as not answered
      await tick();
      await tick();
      assert.equal(runs.length, MAX_RUNS + 1, 'the waiting batch starts when a run ends');
      for (const r of runs.slice(1)) r.exit(1);
      const results = await Promise.all(all);
      assert.ok(results.every((x) => x === false));
    }
  });

  test('a run that fails (no fping, exit 4) answers false and is logged', async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    {
      const warned: string[] = [];
      const spy = createLogger(
        'warn',
        new Writable({
          write(chunk: Buffer, _enc, cb) {
            warned.push(chunk.toString());
            cb();
          },
        }),
      );
      const { runs, spawn } = fakeSpawn();
      const p = new IcmpProber({ timeoutMs: 3000, log: spy, spawn });
      const a = p.probe('198.18.0.10');
      t.mock.timers.tick(BATCH_WINDOW_MS);
      runs[0]?.stderr.write("fping: can't create socket (must run as root?)\n");
      runs[0]?.exit(4);
      assert.equal(await a, false);
      assert.equal(warned.length, 1);
      assert.match(warned[0] ?? '', /exit 4: fping: can't create socket/);
      const b = p.probe('198.18.0.10');
      t.mock.timers.tick(BATCH_WINDOW_MS);
      runs[1]?.emit('error', new Error('spawn fping ENOENT'));
      assert.equal(await b, false);
      assert.equal(warned.length, 1, 'at most one warning a minute');
    }
  });

  test('a run that hangs past its timeout is killed and its probes fail', async (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    {
      const { runs, spawn } = fakeSpawn();
      const p = new IcmpProber({ timeoutMs: 3000, log, spawn });
      const a = p.probe('198.18.0.10');
      t.mock.timers.tick(BATCH_WINDOW_MS);
      t.mock.timers.tick(3000 + 5000);
      assert.equal(runs[0]?.killed, 'SIGKILL');
      assert.equal(await a, false);
    }
  });

  test('anything but an IPv4 literal is never passed to fping', async () => {
    const { runs, spawn } = fakeSpawn();
    const p = new IcmpProber({ timeoutMs: 3000, log, spawn });
    assert.equal(await p.probe('-f/etc/passwd'), false);
    assert.equal(await p.probe('example.com'), false);
    assert.equal(runs.length, 0);
  });
});

describe('icmpUnavailable', () => {
  test('fping answering 127.0.0.1: available', async () => {
    const { runs, spawn } = fakeSpawn();
    const r = icmpUnavailable({ log, spawn });
    assert.deepEqual(runs[0]?.ips, ['127.0.0.1']);
    runs[0]?.say('127.0.0.1 is alive');
    runs[0]?.exit(0);
    assert.equal(await r, undefined);
  });
  test('no fping, or no permission: the reason', async () => {
    const { runs, spawn } = fakeSpawn();
    const r = icmpUnavailable({ log, spawn });
    runs[0]?.emit('error', new Error('spawn fping ENOENT'));
    assert.equal(await r, 'fping: spawn fping ENOENT');
    const r2 = icmpUnavailable({ log, spawn });
    runs[1]?.stderr.write("fping: can't create socket (must run as root?)\n");
    runs[1]?.exit(4);
    assert.match((await r2) ?? '', /exited 4: fping: can't create socket/);
  });
});
