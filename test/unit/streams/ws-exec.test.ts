// End-to-end: handleWebSocketExec behind an HTTP server on 127.0.0.1, driven by a `ws` client speaking
// the channel protocol the way client-go's WebSocket executor does.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { after, before, describe, it } from 'node:test';
import WebSocket from 'ws';
import type { ExecHandler, ExecStreams } from '../../../src/kubelet/streams/exec-session.ts';
import { delay, type ExecServer, readAll, startExecServer, waitFor } from './helpers.ts';

const EXIT_3 =
  '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}';
const SUCCESS = '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}';

let current: ExecHandler = async () => ({ kind: 'success' });
const dispatch: ExecHandler = (s) => current(s);

function waitAbort(s: ExecStreams): Promise<void> {
  return new Promise((resolve) => {
    if (s.signal.aborted) resolve();
    else s.signal.addEventListener('abort', () => resolve(), { once: true });
  });
}

interface WsClient {
  ws: WebSocket;
  /** Payload per channel, concatenated. */
  channels: Map<number, Buffer>;
  /** Every message as received: [channel, payload]. */
  messages: Array<[number, Buffer]>;
  binaryFlags: boolean[];
  closed: Promise<{ code: number }>;
  send(channel: number, data: string | Buffer): void;
}

async function connect(port: number, protocols: string[]): Promise<WsClient> {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/exec/ns/pod/c`, protocols);
  const channels = new Map<number, Buffer>();
  const messages: Array<[number, Buffer]> = [];
  const binaryFlags: boolean[] = [];
  const base64 = protocols.some((p) => p.includes('base64'));
  ws.on('message', (data: Buffer, isBinary: boolean) => {
    binaryFlags.push(isBinary);
    const channel = base64 ? data[0]! - 48 : data[0]!;
    const payload = base64 ? Buffer.from(data.subarray(1).toString(), 'base64') : data.subarray(1);
    messages.push([channel, payload]);
    channels.set(channel, Buffer.concat([channels.get(channel) ?? Buffer.alloc(0), payload]));
  });
  const closed = new Promise<{ code: number }>((resolve) => ws.on('close', (code) => resolve({ code })));
  await once(ws, 'open');
  return {
    ws,
    channels,
    messages,
    binaryFlags,
    closed,
    send: (channel, data) => {
      const buf = Buffer.from(data);
      if (base64) ws.send(String.fromCharCode(48 + channel) + buf.toString('base64'));
      else ws.send(Buffer.concat([Buffer.from([channel]), buf]));
    },
  };
}

describe('WebSocket exec transport', () => {
  let server: ExecServer;
  let ttyServer: ExecServer;
  let idleServer: ExecServer;

  before(async () => {
    const base = { stdin: true, stdout: true, stderr: true, tty: false, idleTimeoutMs: 10_000 };
    server = await startExecServer(dispatch, base);
    ttyServer = await startExecServer(dispatch, { ...base, stderr: false, tty: true });
    idleServer = await startExecServer(dispatch, { ...base, stdin: false, idleTimeoutMs: 200 });
  });
  after(async () => {
    await Promise.all([server.close(), ttyServer.close(), idleServer.close()]);
  });

  it('v5: echoes stdin until the close signal, writes stderr, reports exit 3, closes normally', async () => {
    current = async (s) => {
      const input = await readAll(s.stdin!);
      s.stdout!.write(input);
      s.stderr!.write('oops\n');
      return { kind: 'exit', code: 3 };
    };
    const c = await connect(server.port, ['v5.channel.k8s.io']);
    assert.equal(c.ws.protocol, 'v5.channel.k8s.io');
    c.send(0, 'hello ');
    c.send(0, 'world');
    c.ws.send(Buffer.from([255, 0])); // v5 CLOSE for stdin
    const { code } = await c.closed;
    assert.equal(code, 1000);
    assert.deepEqual(c.messages[0], [1, Buffer.alloc(0)], 'empty ready frame on stdout first');
    assert.equal(c.channels.get(1)?.toString(), 'hello world');
    assert.equal(c.channels.get(2)?.toString(), 'oops\n');
    assert.equal(c.channels.get(3)?.toString(), EXIT_3);
    assert.ok(c.binaryFlags.every((b) => b));
    assert.deepEqual(await server.nextFinish(), { outcome: { kind: 'exit', code: 3 }, aborted: null });
  });

  it('v4 binary: Status JSON on channel 3', async () => {
    current = async (s) => {
      s.stdout!.write('out');
      return { kind: 'success' };
    };
    const c = await connect(server.port, ['v4.channel.k8s.io', 'channel.k8s.io']);
    assert.equal(c.ws.protocol, 'v4.channel.k8s.io');
    await c.closed;
    assert.equal(c.channels.get(1)?.toString(), 'out');
    assert.equal(c.channels.get(3)?.toString(), SUCCESS);
    await server.nextFinish();
  });

  it('v4.base64: text frames in both directions', async () => {
    current = async (s) => {
      const chunk = await new Promise<Buffer>((resolve) => s.stdin!.once('data', resolve));
      s.stdout!.write(chunk);
      return { kind: 'exit', code: 3 };
    };
    const c = await connect(server.port, ['v4.base64.channel.k8s.io']);
    assert.equal(c.ws.protocol, 'v4.base64.channel.k8s.io');
    c.send(0, Buffer.from([0, 1, 2, 250, 255]));
    await c.closed;
    assert.deepEqual(c.channels.get(1), Buffer.from([0, 1, 2, 250, 255]));
    assert.equal(c.channels.get(3)?.toString(), EXIT_3);
    assert.ok(
      c.binaryFlags.every((b) => !b),
      'text frames only',
    );
    await server.nextFinish();
  });

  it('channel.k8s.io (v1): plain-text failure, nothing on success', async () => {
    current = async () => ({ kind: 'exit', code: 9 });
    const c = await connect(server.port, ['channel.k8s.io']);
    await c.closed;
    assert.equal(c.channels.get(3)?.toString(), 'command terminated with non-zero exit code: 9');
    await server.nextFinish();
    current = async () => ({ kind: 'success' });
    const d = await connect(server.port, ['base64.channel.k8s.io']);
    await d.closed;
    assert.equal(d.channels.get(3), undefined);
    await server.nextFinish();
  });

  it('tty: resize messages on channel 4', async () => {
    current = async (s) => {
      const sizes: string[] = [];
      for await (const size of s.resize!) {
        sizes.push(`${size.width}x${size.height}`);
        if (sizes.length === 2) break;
      }
      s.stdout!.write(sizes.join(','));
      return { kind: 'success' };
    };
    const c = await connect(ttyServer.port, ['v5.channel.k8s.io']);
    c.send(4, '{"Width":80,"Height":24}\n');
    c.send(4, '{"Width":132,"Height":43}\n');
    await c.closed;
    assert.equal(c.channels.get(1)?.toString(), '80x24,132x43');
    assert.equal(c.channels.get(2), undefined);
    await ttyServer.nextFinish();
  });

  it('client disconnect aborts the handler signal', async () => {
    let aborted = false;
    current = async (s) => {
      await waitAbort(s);
      aborted = true;
      return { kind: 'success' };
    };
    const c = await connect(server.port, ['v5.channel.k8s.io']);
    await delay(20);
    c.ws.terminate();
    const fin = await server.nextFinish();
    assert.deepEqual(fin, { outcome: null, aborted: 'client disconnected' });
    await waitFor(() => aborted, 2000, 'handler abort');
  });

  it('idle timeout aborts and drops the connection', async () => {
    current = async (s) => {
      await waitAbort(s);
      return { kind: 'success' };
    };
    const c = await connect(idleServer.port, ['v5.channel.k8s.io']);
    const fin = await idleServer.nextFinish();
    assert.equal(fin.aborted, 'idle timeout');
    const { code } = await c.closed;
    assert.notEqual(code, 1000);
  });

  it('refuses unsupported sub-protocols', async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${server.port}/exec/ns/pod/c`, ['v3.channel.k8s.io']);
    ws.on('error', () => undefined);
    const [, res] = (await once(ws, 'unexpected-response')) as [unknown, { statusCode: number }];
    assert.equal(res.statusCode, 403);
    ws.terminate();
  });

  it('a large stdout write arrives intact', async () => {
    const payload = Buffer.alloc(1 << 20);
    for (let i = 0; i < payload.length; i++) payload[i] = i % 253;
    current = async (s) => {
      await new Promise<void>((resolve) => s.stdout!.write(payload, () => resolve()));
      return { kind: 'success' };
    };
    const c = await connect(server.port, ['v5.channel.k8s.io']);
    await c.closed;
    assert.ok(c.channels.get(1)?.equals(payload));
    assert.equal(c.channels.get(3)?.toString(), SUCCESS);
    await server.nextFinish();
  });
});
