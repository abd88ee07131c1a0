// `vm status --event --format json` (cocoon-cli.md §3.3, §8.6): ADDED for existing VMs on the
// first tick, ADDED/MODIFIED/DELETED as the DB changes, a crash (no DB write) seen by the
// default 5 s ticker, one compact JSON object per line, exit 0 on SIGTERM.
import assert from 'node:assert/strict';
import type { ChildProcessWithoutNullStreams } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { newSimRoot, type SimRoot, type VmRecord } from '../../sim/client.ts';

interface Event {
  event: 'ADDED' | 'MODIFIED' | 'DELETED';
  vm: VmRecord;
}

class Stream {
  readonly lines: string[] = [];
  private partial = '';
  readonly child: ChildProcessWithoutNullStreams;
  constructor(child: ChildProcessWithoutNullStreams) {
    this.child = child;
    child.stdout.on('data', (d: Buffer) => {
      const text = this.partial + d.toString('utf8');
      const parts = text.split('\n');
      this.partial = parts.pop() ?? '';
      this.lines.push(...parts);
    });
  }
  get events(): Event[] {
    return this.lines.map((l) => JSON.parse(l) as Event);
  }
  async waitFor(pred: (e: Event) => boolean, ms: number): Promise<Event> {
    const deadline = Date.now() + ms;
    for (;;) {
      const hit = this.events.find(pred);
      if (hit) return hit;
      if (Date.now() > deadline)
        throw new Error(`no matching event within ${ms} ms; got ${this.lines.join('\n')}`);
      await sleep(50);
    }
  }
}

describe('vm status --event', { concurrency: 1 }, () => {
  let sim: SimRoot;
  let stream: Stream;
  let first: VmRecord;

  before(async () => {
    sim = await newSimRoot();
    await sim.fixtureSnapshot('base', {
      backend: 'cloud-hypervisor',
      image: 'ghcr.io/acme/agent:5',
      pulled: true,
    });
    first = await sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', 'vk-ev-0', 'base']);
    stream = new Stream(sim.spawn(['vm', 'status', '--event', '--format', 'json']));
  });
  after(async () => {
    if (stream.child.exitCode === null) stream.child.kill('SIGKILL');
    await sim.cleanup();
  });

  test('first tick: ADDED for every existing VM, compact lines', async () => {
    const e = await stream.waitFor((x) => x.event === 'ADDED' && x.vm.id === first.id, 5000);
    assert.equal(e.vm.state, 'running');
    assert.ok(!stream.lines[0]?.includes('\n  '), 'one compact object per line');
    assert.equal(stream.lines[0], JSON.stringify(JSON.parse(stream.lines[0] as string)));
  });

  test('a new VM is ADDED promptly (DB watch)', async () => {
    const vm = await sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', 'vk-ev-1', 'base']);
    // Well under the 5 s ticker: the DB watch (200 ms debounce) saw the write.
    await stream.waitFor((x) => x.vm.id === vm.id && x.vm.state === 'running', 4000);
  });

  test('a crash (no DB write) is MODIFIED to "stopped (stale)" by the default 5 s ticker', async () => {
    await sim.run(['__sim', 'crash', first.id]);
    const e = await stream.waitFor((x) => x.event === 'MODIFIED' && x.vm.id === first.id, 9000);
    assert.equal(e.vm.state, 'stopped (stale)');
    assert.equal(e.vm.pid, first.pid);
  });

  test('rm emits DELETED with the last known record; pid-only changes emit nothing', async () => {
    await sim.run(['vm', 'start', first.id]); // state back to running: MODIFIED
    await stream.waitFor(
      (x) => x.event === 'MODIFIED' && x.vm.id === first.id && x.vm.state === 'running',
      5000,
    );
    const before = stream.lines.length;
    await sim.run(['vm', 'rm', '--force', first.id]);
    const e = await stream.waitFor((x) => x.event === 'DELETED' && x.vm.id === first.id, 5000);
    assert.equal(e.vm.config.name, 'vk-ev-0');
    assert.equal(e.vm.state, 'running');
    assert.equal(stream.lines.length, before + 1, 'no MODIFIED before the DELETED');
  });

  test('SIGTERM ends the stream with exit 0 and logs the call', async () => {
    const done = new Promise<number | null>((r) => stream.child.once('close', (code) => r(code)));
    stream.child.kill('SIGTERM');
    assert.equal(await done, 0);
    const call = sim.calls().find((c) => c.argv[1] === 'status');
    assert.deepEqual(call?.argv, ['vm', 'status', '--event', '--format', 'json']);
    assert.equal(call?.exit, 0);
  });
});
