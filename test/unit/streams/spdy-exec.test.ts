// End-to-end: an HTTP server on 127.0.0.1 hands `upgrade` to handleSpdyExec; clients speak SPDY/3.1 the
// way client-go's remotecommand does (error stream first, each stream awaiting its SYN_REPLY).
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import type { ExecHandler, ExecStreams } from '../../../src/kubelet/streams/exec-session.ts';
import { FLAG_FIN, SETTINGS_ID } from '../../../src/kubelet/streams/spdy-frames.ts';
import {
  delay,
  type ExecServer,
  RawSpdyClient,
  rawUpgrade,
  readAll,
  spdyClient,
  spdyUpgradeHeaders,
  startExecServer,
  waitFor,
} from './helpers.ts';

const EXIT_3 =
  '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}';
const SUCCESS = '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}';

/** A handler chosen per test through the first stdin line would be overkill: tests swap this. */
let current: ExecHandler = async () => ({ kind: 'success' });
const dispatch: ExecHandler = (s) => current(s);

const echoExit3: ExecHandler = async (s) => {
  assert.ok(s.stdin && s.stdout && s.stderr);
  const input = await readAll(s.stdin);
  s.stdout.write(input);
  s.stderr.write('oops\n');
  return { kind: 'exit', code: 3 };
};

function waitAbort(s: ExecStreams): Promise<void> {
  return new Promise((resolve) => {
    if (s.signal.aborted) resolve();
    else s.signal.addEventListener('abort', () => resolve(), { once: true });
  });
}

describe('SPDY exec transport', () => {
  let server: ExecServer;
  let ttyServer: ExecServer;
  let idleServer: ExecServer;

  before(async () => {
    const base = { stdin: true, stdout: true, stderr: true, tty: false, idleTimeoutMs: 10_000 };
    // Long enough that a loaded machine still opens the four streams in time (300 ms did not,
    // once, in a full suite run); the test of the timeout waits it out.
    server = await startExecServer(dispatch, { ...base, streamCreationTimeoutMs: 1500 });
    ttyServer = await startExecServer(dispatch, { ...base, stderr: false, tty: true });
    idleServer = await startExecServer(dispatch, {
      ...base,
      stdin: false,
      stderr: false,
      idleTimeoutMs: 200,
    });
  });
  after(async () => {
    await Promise.all([server.close(), ttyServer.close(), idleServer.close()]);
  });

  it('negotiates v5 from repeated offers, echoes stdin, writes stderr, reports exit 3', async () => {
    current = echoExit3;
    const c = await spdyClient(server.port);
    assert.equal(c.protocol, 'v5.channel.k8s.io');
    const error = await c.open('error');
    const stdin = await c.open('stdin');
    const stdout = await c.open('stdout');
    const stderr = await c.open('stderr');
    const [out, err, status] = [readAll(stdout), readAll(stderr), readAll(error)];
    stdin.write('hello ');
    stdin.end('world');
    assert.equal((await out).toString(), 'hello world');
    assert.equal((await err).toString(), 'oops\n');
    assert.equal((await status).toString(), EXIT_3);
    await c.closed;
    const fin = await server.nextFinish();
    assert.deepEqual(fin, { outcome: { kind: 'exit', code: 3 }, aborted: null });
  });

  it('accepts comma-joined offers and prefers v4 over older ones', async () => {
    current = async (s) => {
      s.stdout?.write('x');
      return { kind: 'success' };
    };
    const c = await spdyClient(server.port, [
      ['X-Stream-Protocol-Version', 'channel.k8s.io, v4.channel.k8s.io'],
    ]);
    assert.equal(c.protocol, 'v4.channel.k8s.io');
    const error = await c.open('error');
    const stdin = await c.open('stdin');
    const stdout = await c.open('stdout');
    await c.open('stderr');
    stdin.end();
    assert.equal((await readAll(stdout)).toString(), 'x');
    assert.equal((await readAll(error)).toString(), SUCCESS);
    await server.nextFinish();
  });

  it('v3 writes plain text on failure and nothing on success', async () => {
    for (const [outcome, expected] of [
      [{ kind: 'exit', code: 7 }, 'command terminated with non-zero exit code: 7'],
      [{ kind: 'success' }, ''],
    ] as const) {
      current = async () => outcome;
      const c = await spdyClient(server.port, [['X-Stream-Protocol-Version', 'v3.channel.k8s.io']]);
      assert.equal(c.protocol, 'v3.channel.k8s.io');
      const error = await c.open('error');
      for (const t of ['stdin', 'stdout', 'stderr']) await c.open(t);
      assert.equal((await readAll(error)).toString(), expected);
      await server.nextFinish();
    }
  });

  it('a throwing handler becomes an InternalError status', async () => {
    current = async () => {
      throw new Error('vm exploded');
    };
    const c = await spdyClient(server.port);
    const error = await c.open('error');
    for (const t of ['stdin', 'stdout', 'stderr']) await c.open(t);
    const status = JSON.parse((await readAll(error)).toString());
    assert.equal(status.reason, 'InternalError');
    assert.equal(status.message, 'Internal error occurred: vm exploded');
    assert.equal(status.code, 500);
    await server.nextFinish();
  });

  it('delivers stdin EOF to the handler and half-closes stdin back', async () => {
    current = async (s) => {
      let n = 0;
      for await (const chunk of s.stdin!) n += (chunk as Buffer).length;
      s.stdout!.write(`got ${n} bytes then EOF`);
      return { kind: 'success' };
    };
    const c = await spdyClient(server.port);
    const error = await c.open('error');
    const stdin = await c.open('stdin');
    const stdout = await c.open('stdout');
    await c.open('stderr');
    const resets: number[] = [];
    stdin.on('reset', (code: number) => resets.push(code));
    const stdinClosedByServer = readAll(stdin); // client-go waits on this to close its stdin
    stdin.write(Buffer.alloc(100_000, 1));
    stdin.end();
    assert.equal((await readAll(stdout)).toString(), 'got 100000 bytes then EOF');
    assert.equal((await readAll(error)).toString(), SUCCESS);
    await stdinClosedByServer;
    assert.deepEqual(resets, [], 'closed with FIN, not RST_STREAM');
    await server.nextFinish();
  });

  it('tty: delivers resize messages split across frames', async () => {
    current = async (s) => {
      assert.equal(s.tty, true);
      assert.equal(s.stderr, null);
      const sizes: string[] = [];
      for await (const size of s.resize!) {
        sizes.push(`${size.width}x${size.height}`);
        if (sizes.length === 3) break;
      }
      s.stdout!.write(sizes.join(','));
      return { kind: 'success' };
    };
    const c = await spdyClient(ttyServer.port);
    const error = await c.open('error');
    await c.open('stdin');
    const stdout = await c.open('stdout');
    const resize = await c.open('resize');
    resize.write('{"Width":80,"Height":24}\n{"Width":100,');
    await delay(20);
    resize.write('"Height":30}\n');
    resize.write('{"Width":120,"Height":40}\n');
    assert.equal((await readAll(stdout)).toString(), '80x24,100x30,120x40');
    assert.equal((await readAll(error)).toString(), SUCCESS);
    await ttyServer.nextFinish();
  });

  it('client disconnect aborts the handler signal', async () => {
    let aborted = false;
    current = async (s) => {
      await waitAbort(s);
      aborted = true;
      return { kind: 'success' };
    };
    const c = await spdyClient(server.port);
    for (const t of ['error', 'stdin', 'stdout', 'stderr']) await c.open(t);
    await delay(30);
    c.socket.destroy();
    const fin = await server.nextFinish();
    assert.deepEqual(fin, { outcome: null, aborted: 'client disconnected' });
    await waitFor(() => aborted, 2000, 'handler abort');
  });

  it('client GOAWAY (spdystream Close) aborts the handler signal', async () => {
    current = async (s) => {
      await waitAbort(s);
      return { kind: 'success' };
    };
    const c = await spdyClient(server.port);
    for (const t of ['error', 'stdin', 'stdout', 'stderr']) await c.open(t);
    c.session.goAway();
    const fin = await server.nextFinish();
    assert.equal(fin.aborted, 'client disconnected');
  });

  it('idle timeout aborts and closes the connection', async () => {
    current = async (s) => {
      await waitAbort(s);
      return { kind: 'success' };
    };
    const c = await spdyClient(idleServer.port);
    await c.open('error');
    await c.open('stdout');
    const fin = await idleServer.nextFinish();
    assert.equal(fin.aborted, 'idle timeout');
    await c.closed;
  });

  it('drops a client that does not open the expected streams in time', async () => {
    let called = false;
    current = async () => {
      called = true;
      return { kind: 'success' };
    };
    const c = await spdyClient(server.port);
    await c.open('error');
    await c.open('stdin');
    const fin = await server.nextFinish();
    assert.equal(fin.aborted, 'stream creation timeout');
    await c.closed;
    assert.equal(called, false);
    assert.ok(server.errors.some((e) => /timed out waiting for client to create streams/.test(e.message)));
  });

  it('refuses a non-SPDY upgrade (400) and unknown protocols (403)', async () => {
    const bad = await rawUpgrade(server.port, [
      ['Connection', 'Upgrade'],
      ['Upgrade', 'h2c'],
    ]);
    assert.equal(bad.status, 400);
    bad.socket.destroy();
    const unknown = await rawUpgrade(
      server.port,
      spdyUpgradeHeaders([['X-Stream-Protocol-Version', 'v9.channel.k8s.io']]),
    );
    assert.equal(unknown.status, 403);
    assert.deepEqual(unknown.headers.get('x-accepted-stream-protocol-versions'), [
      'v5.channel.k8s.io',
      'v4.channel.k8s.io',
      'v3.channel.k8s.io',
      'v2.channel.k8s.io',
      'channel.k8s.io',
    ]);
    unknown.socket.destroy();
  });

  it('answers PINGs and tolerates SETTINGS and unknown control frames', async () => {
    current = async (s) => {
      await waitAbort(s);
      return { kind: 'success' };
    };
    const raw = await RawSpdyClient.connect(server.port);
    raw.send({
      type: 'SETTINGS',
      flags: 0,
      entries: [{ flags: 0, id: SETTINGS_ID.MAX_CONCURRENT_STREAMS, value: 100 }],
    });
    raw.send({ type: 'UNKNOWN', version: 3, controlType: 10, flags: 0, payload: Buffer.from('cred') });
    raw.send({ type: 'PING', flags: 0, id: 1 });
    raw.send({ type: 'PING', flags: 0, id: 3 });
    await raw.waitFrame((f) => f.type === 'PING' && f.id === 1);
    await raw.waitFrame((f) => f.type === 'PING' && f.id === 3);
    raw.close();
    await server.nextFinish();
  });

  it('flow control: a 1 MiB stdout write only advances as the client grants window', async () => {
    const total = 1 << 20;
    let writeDone = false;
    current = async (s) => {
      await new Promise<void>((resolve) => s.stdout!.write(Buffer.alloc(total, 0x61), () => resolve()));
      writeDone = true;
      return { kind: 'success' };
    };
    const raw = await RawSpdyClient.connect(server.port);
    // A flow-controlling SPDY/3.1 peer announces its window before anything else.
    raw.send({
      type: 'SETTINGS',
      flags: 0,
      entries: [{ flags: 0, id: SETTINGS_ID.INITIAL_WINDOW_SIZE, value: 65536 }],
    });
    const types = ['error', 'stdin', 'stdout', 'stderr'];
    for (const [i, t] of types.entries()) {
      await raw.synStream(2 * i + 1, { streamType: t });
      await raw.waitFrame((f) => f.type === 'SYN_REPLY' && f.streamId === 2 * i + 1);
    }
    const stdout = 5;
    let streamGranted = 65536;
    let sessionGranted = 65536;
    const received = () => raw.dataOn(stdout).length;
    // The server fills exactly the initial window, then stalls.
    await waitFor(() => received() === 65536, 5000, 'initial window');
    await delay(100);
    assert.equal(received(), 65536);
    assert.equal(writeDone, false);
    while (received() < total) {
      const step = 48 * 1024;
      raw.send({ type: 'WINDOW_UPDATE', flags: 0, streamId: stdout, deltaWindowSize: step });
      raw.send({ type: 'WINDOW_UPDATE', flags: 0, streamId: 0, deltaWindowSize: step });
      streamGranted += step;
      sessionGranted += step;
      await waitFor(() => received() >= Math.min(total, streamGranted), 5000, 'granted bytes');
      assert.ok(received() <= Math.min(streamGranted, sessionGranted), 'never beyond the window');
    }
    assert.equal(received(), total);
    // stdout used up the whole session window: the Status waits for the client to grant more.
    await delay(100);
    assert.equal(raw.dataOn(1).length, 0);
    raw.send({ type: 'WINDOW_UPDATE', flags: 0, streamId: 0, deltaWindowSize: 65536 });
    await raw.waitFrame((f) => f.type === 'DATA' && f.streamId === 1 && f.data.length > 0);
    assert.equal(raw.dataOn(1).toString(), SUCCESS);
    assert.ok(raw.finOn(stdout));
    // Every DATA frame of the stream stayed within the window (checked frame by frame, in order).
    let seen = 0;
    for (const f of raw.frames) if (f.type === 'DATA' && f.streamId === stdout) seen += f.data.length;
    assert.equal(seen, total);
    raw.close();
    await server.nextFinish();
  });

  it('flow control: a peer that never sends WINDOW_UPDATE (spdystream) still gets all 1 MiB', async () => {
    const payload = Buffer.alloc(1 << 20);
    for (let i = 0; i < payload.length; i++) payload[i] = i % 251;
    current = async (s) => {
      s.stdout!.write(payload);
      return { kind: 'exit', code: 3 };
    };
    const c = await spdyClient(server.port);
    const error = await c.open('error');
    const stdin = await c.open('stdin');
    const stdout = await c.open('stdout');
    await c.open('stderr');
    stdin.end();
    const out = await readAll(stdout);
    assert.equal(out.length, payload.length);
    assert.ok(out.equals(payload));
    assert.equal((await readAll(error)).toString(), EXIT_3);
    await server.nextFinish();
  });

  it('flow control: stdin consumption is acknowledged with WINDOW_UPDATE', async () => {
    const total = 300 * 1024;
    current = async (s) => {
      let n = 0;
      for await (const chunk of s.stdin!) n += (chunk as Buffer).length;
      s.stdout!.write(String(n));
      return { kind: 'success' };
    };
    const raw = await RawSpdyClient.connect(server.port);
    for (const [i, t] of ['error', 'stdin', 'stdout', 'stderr'].entries()) {
      await raw.synStream(2 * i + 1, { streamType: t });
      await raw.waitFrame((f) => f.type === 'SYN_REPLY' && f.streamId === 2 * i + 1);
    }
    const stdin = 3;
    const granted = (id: number) =>
      65536 +
      raw.frames.reduce(
        (a, f) => a + (f.type === 'WINDOW_UPDATE' && f.streamId === id ? f.deltaWindowSize : 0),
        0,
      );
    let sent = 0;
    // Send only as far as both windows allow, as a compliant peer must.
    while (sent < total) {
      const room = Math.min(granted(stdin), granted(0)) - sent;
      if (room <= 0) {
        await waitFor(() => Math.min(granted(stdin), granted(0)) > sent, 5000, 'WINDOW_UPDATE for stdin');
        continue;
      }
      const n = Math.min(room, 8192, total - sent);
      raw.send({ type: 'DATA', streamId: stdin, flags: 0, data: Buffer.alloc(n, 7) });
      sent += n;
    }
    raw.send({ type: 'DATA', streamId: stdin, flags: FLAG_FIN, data: Buffer.alloc(0) });
    await raw.waitFrame((f) => f.type === 'DATA' && f.streamId === 5 && (f.flags & FLAG_FIN) === FLAG_FIN);
    assert.equal(raw.dataOn(5).toString(), String(total));
    assert.ok(granted(stdin) > total - 65536, 'stream window replenished');
    assert.ok(granted(0) > total - 65536, 'session window replenished');
    raw.close();
    await server.nextFinish();
  });
});
