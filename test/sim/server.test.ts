// Server mode (docs/simulator.md, "Server mode"): the thin client and the root's simulator
// server behave like one `cocoon` process per call. Streaming output arrives as it is written,
// a killed client leaves what a killed process leaves (and the server keeps serving), a hung
// call ends with its client, exit codes and output match the Node fallback, the server does
// not outlive its owner, and requests that take the same locks do not deadlock.
import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { CLIENT_BIN, newSimRoot, type SimRoot, type VmRecord } from '../../sim/client.ts';
import { withLock } from '../../sim/lock.ts';

const IMAGE = 'ghcr.io/acme/agent:9';
const FALLBACK = { COCOON_SIM_SERVER: '0' };

interface ServerStats {
  pid: number;
  active: number;
  served: number;
}

async function until<T>(
  what: string,
  fn: () => Promise<T | undefined> | T | undefined,
  ms = 10_000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined && v !== false) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

function exited(child: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  if (child.exitCode !== null || child.signalCode !== null)
    return Promise.resolve({ code: child.exitCode, signal: child.signalCode });
  return new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
}

function alive(pid: number): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
    return !/^[ZX]$/.test(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0] ?? '');
  } catch {
    return false;
  }
}

const skip = process.env.COCOON_SIM_SERVER === '0' ? 'COCOON_SIM_SERVER=0: process mode only' : false;

describe('simulator server mode', { concurrency: 1, skip }, () => {
  let sim: SimRoot;

  const stats = async (): Promise<ServerStats> => {
    const r = await sim.json<{ server: ServerStats | null }>(['__sim', 'server']);
    assert.ok(r.server, 'served by the server');
    return r.server;
  };
  /** Requests in flight besides the `__sim server` call asking. */
  const othersActive = async () => (await stats()).active - 1;

  before(async () => {
    assert.ok(fs.existsSync(CLIENT_BIN), `${CLIENT_BIN} is missing: run bash scripts/setup.sh`);
    sim = await newSimRoot();
    assert.ok(sim.serverPid, 'newSimRoot started the server');
    await sim.fixtureSnapshot('base', { backend: 'cloud-hypervisor', image: IMAGE, pulled: true });
  });
  after(async () => {
    const log = fs.readFileSync(path.join(sim.root, 'sim', 'server.log'), 'utf8');
    await sim.cleanup();
    assert.doesNotMatch(log, /uncaught|unhandled|defer failed/, 'the server logged no error');
  });

  test('the cocoon symlink and the shim reach the server; COCOON_SIM_SERVER=0 is a Node process', async () => {
    assert.equal(fs.realpathSync(sim.cocoonBin), fs.realpathSync(CLIENT_BIN));
    const viaLink = await sim.json<{ server: ServerStats | null }>(['__sim', 'server'], { viaShim: true });
    assert.equal(viaLink.server?.pid, sim.serverPid);
    const viaShim = await sim.helper(['__sim', 'server'], { viaShim: true });
    assert.equal((JSON.parse(viaShim.stdout) as { server: ServerStats }).server.pid, sim.serverPid);
    for (const viaShimToo of [false, true]) {
      const r = await sim.json<{ server: null }>(['__sim', 'server'], { env: FALLBACK, viaShim: viaShimToo });
      assert.equal(r.server, null);
    }
  });

  test('exit codes, stdout and stderr match the Node fallback', async () => {
    const vm = await sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', 'vk-same', 'base']);
    await sim.setKnobs({
      faults: [{ argvRegex: '^image inspect scripted$', exit: 3, stdout: 'out\n', stderr: 'err\n' }],
    });
    const cases: string[][] = [
      ['vm', 'inspect', vm.id],
      ['vm', 'inspect', 'nope'],
      ['vm', 'inspect'],
      ['vm', 'list'],
      ['vm', 'bogus'],
      ['vm', 'clone', '--cpu-weight', 'x', 'base'],
      ['vm', 'rm', '--frob', 'x'],
      ['snapshot', 'inspect', 'base'],
      ['snapshot', 'rm', 'missing'],
      ['image', 'inspect', 'scripted'],
      ['vm', 'exec', vm.id, '--', 'false'],
      ['vm', 'exec', vm.id, '--', 'echo', 'hi'],
      ['vm', '--help'],
      ['fixture', 'image', 'x'],
    ];
    for (const args of cases) {
      for (const viaShim of [false, true]) {
        const server = await sim.run(args, { viaShim });
        const fallback = await sim.run(args, { env: FALLBACK, viaShim });
        const what = `cocoon ${args.join(' ')}${viaShim ? ' (via the symlink)' : ''}`;
        assert.equal(server.code, fallback.code, `${what}: exit status`);
        assert.equal(server.signal, null, what);
        assert.equal(server.stdout, fallback.stdout, `${what}: stdout`);
        assert.equal(server.stderr, fallback.stderr, `${what}: stderr`);
      }
    }
    assert.equal((await sim.run(['image', 'inspect', 'scripted'])).code, 3);
    assert.equal((await sim.run(['vm', 'inspect', 'nope'])).stderr, 'Error: vm not found: nope\n');
    // Both modes write the same calls.jsonl record.
    const recs = sim.calls().filter((c) => c.argv.join(' ') === 'vm inspect nope');
    assert.equal(recs.length, 5);
    for (const r of recs) {
      assert.deepEqual(Object.keys(r), ['argv', 'exit', 'startedAt', 'durationMs', 'stdinBytes']);
      assert.equal(r.exit, 1);
    }
    // stdin is streamed to the server when the verb reads it.
    const cat = await sim.run(['vm', 'exec', '-i', vm.id, '--', 'cat'], { stdin: 'hello\nworld\n' });
    assert.equal(cat.stdout, 'hello\nworld\n');
    const last = sim.calls().at(-1);
    assert.equal(last?.stdinBytes, 12);
    await sim.setKnobs({});
    // A relative root is resolved by the caller's cwd: the client leaves that to the fallback.
    const rel = path.relative(process.cwd(), sim.root);
    const r = await sim.json<{ server: null }>(['__sim', 'server'], {
      env: { COCOON_SIM_ROOT: rel, COCOON_ROOT_DIR: rel },
    });
    assert.equal(r.server, null);
  });

  test('streaming output arrives as it is written (vm status --event)', async () => {
    const child = sim.spawn(['vm', 'status', '--event', '--format', 'json']);
    let text = '';
    child.stdout.on('data', (d: Buffer) => {
      text += d.toString();
    });
    try {
      await until('the first ADDED events', () => text.includes('"vk-same"'));
      assert.equal(child.exitCode, null, 'still streaming');
      const vm = await sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', 'vk-stream', 'base']);
      await until('ADDED for the new clone', () => text.includes(`"id":"${vm.id}"`));
      await sim.run(['vm', 'rm', '--force', vm.id]);
      await until('DELETED for it', () =>
        text.split('\n').some((l) => l.includes('"DELETED"') && l.includes(vm.id)),
      );
      assert.equal(child.exitCode, null, 'still streaming');
      child.kill('SIGTERM');
      const end = await exited(child);
      assert.deepEqual(end, { code: 0, signal: null }, 'SIGTERM ends the stream with exit 0');
      assert.ok(
        sim.calls().some((c) => c.argv.join(' ') === 'vm status --event --format json' && c.exit === 0),
      );
      await until('the stream request to end', async () => (await othersActive()) === 0);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });

  test('a client killed mid-clone leaves the creating placeholder; the server keeps serving', async () => {
    const serverPid = sim.serverPid;
    await sim.mergeKnobs({ latency: { 'vm clone': 1500 } });
    const child = sim.spawn(['vm', 'clone', '--output', 'json', '--name', 'vk-cut', 'base']);
    const placeholder = await until('the placeholder', async () => {
      const list = await sim.run(['vm', 'list', '-o', 'json']);
      return list.stdout.startsWith('[')
        ? (JSON.parse(list.stdout) as VmRecord[]).find((v) => v.config.name === 'vk-cut')
        : undefined;
    });
    assert.equal(placeholder.state, 'creating');
    const busy = await sim.run(['vm', 'reconcile-stale-create', placeholder.id, '-o', 'json']);
    assert.equal(JSON.parse(busy.stdout).outcome, 'busy', 'its creator (the client) is alive');
    process.kill(-(child.pid as number), 'SIGKILL');
    assert.equal((await exited(child)).signal, 'SIGKILL');
    await until('the request to be dropped', async () => (await othersActive()) === 0);
    // Past the latency, the abandoned request has not resumed: nothing committed, nothing rolled back.
    await sleep(2000);
    const after = await sim.json<VmRecord>(['vm', 'inspect', placeholder.id]);
    assert.equal(after.state, 'creating');
    assert.equal(after.pid, 0);
    assert.equal(
      sim.calls().filter((c) => c.argv.includes('vk-cut')).length,
      0,
      'a killed call logs nothing',
    );
    await sim.mergeKnobs({ latency: null });
    const collected = await sim.run(['vm', 'reconcile-stale-create', placeholder.id, '-o', 'json']);
    assert.deepEqual(JSON.parse(collected.stdout), { id: placeholder.id, outcome: 'collected' });
    const again = await sim.json<VmRecord>(['vm', 'clone', '--output', 'json', '--name', 'vk-cut', 'base']);
    assert.equal(again.state, 'running');
    assert.equal(sim.serverPid, serverPid);
    assert.equal((await stats()).pid, serverPid, 'the same server still serves');
    await sim.run(['vm', 'rm', '--force', 'vk-cut']);
  });

  test('a hang knob ends when its client goes; SIGTERM kills a hung call like a process', async () => {
    await sim.setKnobs({ faults: [{ argvRegex: '^vm inspect hang-', hang: true }] });
    const killed = sim.spawn(['vm', 'inspect', 'hang-1']);
    await until('the hung request', async () => (await othersActive()) === 1);
    process.kill(-(killed.pid as number), 'SIGKILL');
    await exited(killed);
    await until('the hung request to end', async () => (await othersActive()) === 0);

    const termed = sim.spawn(['vm', 'inspect', 'hang-2']);
    await until('the hung request', async () => (await othersActive()) === 1);
    termed.kill('SIGTERM');
    assert.deepEqual(await exited(termed), { code: null, signal: 'SIGTERM' });
    await until('the hung request to end', async () => (await othersActive()) === 0);
    assert.equal(
      sim.calls().filter((c) => c.argv[2]?.startsWith('hang-')).length,
      0,
      'killed calls log nothing',
    );
    await sim.setKnobs({});
  });

  test('concurrent requests taking the same locks do not deadlock', async () => {
    // Clones interleave at their latency sleeps; each takes both VM DB locks, the snapshot DB
    // lock, the counters lock (times), the guest and lease locks, between awaits.
    await sim.setKnobs({
      latency: { 'vm clone': { ms: 20, jitterMs: 80 } },
      faults: [{ argvRegex: '^vm clone ', match: '^vk-lock-1$', phase: 'start', error: 'boom', times: 1 }],
    });
    const names = Array.from({ length: 16 }, (_, i) => `vk-lock-${i}`);
    // A request that met a lock of its own process would fail at once ("held by this process
    // outside the current call", sim/lock.ts), one that deadlocked would be killed at 30 s
    // (a hang guard, some 10 times what the 16 clones take on a busy machine): either is a
    // second failure next to the scripted one.
    const results = await Promise.all(
      names.map((n) =>
        sim.run(['vm', 'clone', '--output', 'json', '--name', n, 'base'], { timeoutMs: 30_000 }),
      ),
    );
    const failed = results.filter((r) => r.code !== 0);
    assert.equal(failed.length, 1, failed.map((r) => r.stderr || `killed: ${r.signal}`).join(''));
    assert.equal(failed[0]?.stderr, 'Error: boom\n');
    for (const r of results) assert.doesNotMatch(r.stderr, /held by this process|database is locked/);
    await sim.setKnobs({});
    // A lock held by another (live) process: requests wait for it, then all proceed.
    const holder = spawn('sleep', ['30'], { stdio: 'ignore' });
    const holderStat = fs.readFileSync(`/proc/${holder.pid}/stat`, 'latin1');
    const holderStart = holderStat.slice(holderStat.lastIndexOf(')') + 2).split(' ')[19];
    const lock = `${sim.root}/cloudhypervisor/db/vms.lock`;
    fs.writeFileSync(lock, `${holder.pid} ${holderStart}\n`);
    const waiting = Promise.all(
      ['vk-wait-a', 'vk-wait-b'].map((n) =>
        sim.run(['vm', 'clone', '--output', 'json', '--name', n, 'base']),
      ),
    );
    await sleep(300);
    fs.rmSync(lock);
    holder.kill('SIGKILL');
    for (const r of await waiting) assert.equal(r.code, 0, r.stderr);
    for (const n of [...names, 'vk-wait-a', 'vk-wait-b']) await sim.run(['vm', 'rm', '--force', n]);
  });

  test('withLock refuses an async critical section and a lock its own process leaked', () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'sim-lock-'));
    try {
      const lock = path.join(dir, 'x.lock');
      assert.throws(() => withLock(lock, () => Promise.resolve(1)), /returned a promise/);
      assert.equal(fs.existsSync(lock), false, 'released anyway');
      // Same pid and start time as this process, but not held by this call stack.
      const self = fs.readFileSync('/proc/self/stat', 'latin1');
      fs.writeFileSync(lock, `${process.pid} ${self.slice(self.lastIndexOf(')') + 2).split(' ')[19]}\n`);
      // At once: with no time at all to wait for the lock (timeout 0), the verdict must come
      // from the first look at it, before any wait ("database is locked" otherwise).
      assert.throws(() => withLock(lock, () => 1, 0), /held by this process outside the current call/);
      fs.rmSync(lock);
      assert.equal(
        withLock(lock, () => withLock(lock, () => 2)),
        2,
        're-entrant within one call stack',
      );
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('the server exits when its owner dies', async () => {
    const parent = fs.mkdtempSync(path.join(os.tmpdir(), 'sim-owner-'));
    const code = [
      `import { newSimRoot } from ${JSON.stringify(path.resolve(import.meta.dirname, '../../sim/client.ts'))};`,
      `const sim = await newSimRoot({ parent: ${JSON.stringify(parent)} });`,
      'console.log(JSON.stringify({ pid: sim.serverPid }));',
      'setInterval(() => {}, 60_000);',
    ].join('\n');
    const owner = spawn(process.execPath, ['--input-type=module', '-e', code], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    try {
      let out = '';
      owner.stdout.on('data', (d: Buffer) => {
        out += d.toString();
      });
      const { pid } = await until('the owner to report its server', () =>
        out.includes('\n') ? (JSON.parse(out) as { pid: number }) : undefined,
      );
      assert.ok(pid && alive(pid), 'the server runs');
      owner.kill('SIGKILL');
      await exited(owner);
      await until('the server to exit', () => !alive(pid), 5000);
    } finally {
      owner.kill('SIGKILL');
      fs.rmSync(parent, { recursive: true, force: true });
    }
  });

  test('a root without a server falls back to one Node process per call', async () => {
    const plain = await newSimRoot({ server: false });
    try {
      assert.equal(plain.serverPid, undefined);
      const r = await plain.json<{ server: null }>(['__sim', 'server'], { viaShim: true });
      assert.equal(r.server, null);
      const list = await plain.run(['vm', 'list'], { viaShim: true });
      assert.deepEqual([list.code, list.stdout], [0, 'No VMs found.\n']);
    } finally {
      await plain.cleanup();
    }
  });
});
