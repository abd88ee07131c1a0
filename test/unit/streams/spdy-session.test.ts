import assert from 'node:assert/strict';
import { once } from 'node:events';
import type { AddressInfo } from 'node:net';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import {
  encodeFrame,
  FLAG_FIN,
  GOAWAY_STATUS,
  RST_STATUS,
  SETTINGS_ID,
} from '../../../src/kubelet/streams/spdy-frames.ts';
import {
  SpdySession,
  type SpdySessionOptions,
  type SpdyStream,
} from '../../../src/kubelet/streams/spdy-session.ts';
import { delay, RawSpdyClient, readAll, waitFor } from './helpers.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('streams/spdy-session', () => {
  let listener: net.Server;
  const pending: Array<(s: net.Socket) => void> = [];

  before(async () => {
    listener = net.createServer((s) => pending.shift()?.(s));
    listener.listen(0, '127.0.0.1');
    await once(listener, 'listening');
  });
  after(() => {
    listener.close();
  });

  async function socketPair(): Promise<[net.Socket, net.Socket]> {
    const accepted = new Promise<net.Socket>((resolve) => pending.push(resolve));
    const client = net.connect((listener.address() as AddressInfo).port, '127.0.0.1');
    await once(client, 'connect');
    return [client, await accepted];
  }

  interface Pair {
    client: SpdySession;
    server: SpdySession;
    serverStreams: SpdyStream[];
    serverErrors: Error[];
    clientSocket: net.Socket;
    serverSocket: net.Socket;
  }

  async function sessionPair(
    serverOpts: Partial<SpdySessionOptions> = {},
    clientOpts: Partial<SpdySessionOptions> = {},
  ): Promise<Pair> {
    const [c, s] = await socketPair();
    const serverStreams: SpdyStream[] = [];
    const serverErrors: Error[] = [];
    const server = new SpdySession(s, {
      role: 'server',
      onStream: (st) => {
        serverStreams.push(st);
        st.sendReply();
      },
      onError: (e) => serverErrors.push(e),
      ...serverOpts,
    });
    const client = new SpdySession(c, { role: 'client', ...clientOpts });
    return { client, server, serverStreams, serverErrors, clientSocket: c, serverSocket: s };
  }

  /** A server session facing a frame-level client. */
  async function rawPair(serverOpts: Partial<SpdySessionOptions> = {}) {
    const [c, s] = await socketPair();
    const streams: SpdyStream[] = [];
    const errors: Error[] = [];
    let closed = false;
    const server = new SpdySession(s, {
      role: 'server',
      onStream: (st) => {
        streams.push(st);
        st.sendReply();
      },
      onError: (e) => errors.push(e),
      onClose: () => {
        closed = true;
      },
      ...serverOpts,
    });
    return { raw: new RawSpdyClient(c, Buffer.alloc(0)), server, streams, errors, isClosed: () => closed };
  }

  describe('SpdySession', () => {
    it('opens streams, carries data both ways and half-closes with FIN', async () => {
      const p = await sessionPair();
      const st = p.client.openStream({ streamType: 'stdin', 'X-Other': ['a', 'b'] });
      const replyHeaders = await st.reply;
      assert.equal(replyHeaders.size, 0);
      const srv = p.serverStreams[0]!;
      assert.deepEqual(srv.headers.get('streamtype'), ['stdin']);
      assert.deepEqual(srv.headers.get('x-other'), ['a', 'b']);
      st.end('ping');
      assert.equal((await readAll(srv)).toString(), 'ping');
      srv.end('pong');
      assert.equal((await readAll(st)).toString(), 'pong');
      assert.ok(srv.fullyClosed && st.fullyClosed);
      p.client.destroy();
      await waitFor(() => p.server.closed, 2000, 'server close');
    });

    it('answers pings in both directions; a closed session refuses one', async () => {
      const p = await sessionPair();
      // Each resolves only when the peer echoed its PING (a round trip, measured).
      for (const rtt of [await p.client.ping(), await p.server.ping()]) assert.ok(Number.isFinite(rtt));
      p.client.destroy();
      await assert.rejects(p.client.ping(), /SPDY session closed/);
    });

    it('peer RST ends the readable side and turns later writes into no-ops', async () => {
      const p = await sessionPair();
      const st = p.client.openStream({ streamType: 'stdout' });
      await st.reply;
      const srv = p.serverStreams[0]!;
      const errors: Error[] = [];
      srv.on('error', (e) => errors.push(e));
      const resets: number[] = [];
      srv.on('reset', (code: number) => resets.push(code));
      st.reset(RST_STATUS.CANCEL);
      await readAll(srv);
      assert.deepEqual(resets, [RST_STATUS.CANCEL]);
      await new Promise<void>((resolve) => srv.write('ignored', () => resolve()));
      assert.deepEqual(errors, []);
      p.client.destroy();
    });

    it('rejects a reply when the session dies first', async () => {
      const [c, s] = await socketPair();
      const client = new SpdySession(c, { role: 'client' });
      const st = client.openStream({ streamType: 'error' });
      s.destroy();
      await assert.rejects(st.reply, /closed/);
    });

    it('a smaller SETTINGS INITIAL_WINDOW_SIZE stalls sending until WINDOW_UPDATE', async () => {
      const { raw, server, streams } = await rawPair();
      await raw.synStream(1, { streamType: 'stdout' });
      await raw.waitFrame((f) => f.type === 'SYN_REPLY');
      raw.send({
        type: 'SETTINGS',
        flags: 0,
        entries: [{ flags: 0, id: SETTINGS_ID.INITIAL_WINDOW_SIZE, value: 1000 }],
      });
      await waitFor(() => server.enforcingSendWindow, 2000, 'flow control on');
      const st = streams[0]!;
      let written = false;
      st.write(Buffer.alloc(3000, 1), () => {
        written = true;
      });
      await waitFor(() => raw.dataOn(1).length === 1000, 2000, 'first 1000 bytes');
      await delay(50);
      assert.equal(raw.dataOn(1).length, 1000);
      assert.equal(written, false);
      raw.send({ type: 'WINDOW_UPDATE', flags: 0, streamId: 1, deltaWindowSize: 5000 });
      await waitFor(() => written, 2000, 'write completes');
      // The write's callback fires when the bytes are handed to the socket: they reach the peer
      // after it (seconds later on a loaded machine, found by scripts/loaded-runs.sh).
      await waitFor(() => raw.dataOn(1).length >= 3000, 10_000, 'all 3000 bytes at the peer');
      assert.equal(raw.dataOn(1).length, 3000);
      raw.close();
    });

    it('sends GOAWAY PROTOCOL_ERROR and closes on a malformed frame', async () => {
      const { raw, errors, isClosed } = await rawPair();
      raw.socket.write(Buffer.from('800300030000000400000001', 'hex')); // RST_STREAM with 4-byte body
      const goAway = await raw.waitFrame((f) => f.type === 'GOAWAY');
      assert.equal(goAway.type === 'GOAWAY' && goAway.status, GOAWAY_STATUS.PROTOCOL_ERROR);
      await waitFor(isClosed, 2000, 'server close');
      assert.equal(errors[0]?.name, 'SpdyProtocolError');
      raw.close();
    });

    it('closes on a header block that does not inflate', async () => {
      const { raw, errors, isClosed } = await rawPair();
      raw.send({
        type: 'SYN_STREAM',
        flags: 0,
        streamId: 1,
        associatedStreamId: 0,
        priority: 0,
        slot: 0,
        headerBlock: Buffer.from('garbage'),
      });
      await waitFor(isClosed, 2000, 'server close');
      assert.equal(errors.length, 1);
      raw.close();
    });

    it('refuses reused stream ids, ignores DATA for unknown streams, keeps serving', async () => {
      const { raw, streams } = await rawPair();
      await raw.synStream(3, { streamType: 'a' });
      await raw.waitFrame((f) => f.type === 'SYN_REPLY' && f.streamId === 3);
      await raw.synStream(1, { streamType: 'b' });
      const rst = await raw.waitFrame((f) => f.type === 'RST_STREAM' && f.streamId === 1);
      assert.equal(rst.type === 'RST_STREAM' && rst.status, RST_STATUS.PROTOCOL_ERROR);
      raw.send({ type: 'DATA', streamId: 99, flags: 0, data: Buffer.from('lost') });
      raw.send({ type: 'PING', flags: 0, id: 5 });
      await raw.waitFrame((f) => f.type === 'PING' && f.id === 5);
      assert.equal(streams.length, 1);
      raw.close();
    });

    it('refuses new streams after its own GOAWAY; close() sends the last good stream id', async () => {
      const { raw, server, isClosed } = await rawPair();
      await raw.synStream(1, { streamType: 'error' });
      await raw.waitFrame((f) => f.type === 'SYN_REPLY');
      server.goAway();
      const g = await raw.waitFrame((f) => f.type === 'GOAWAY');
      assert.equal(g.type === 'GOAWAY' && g.lastGoodStreamId, 1);
      await raw.synStream(3, { streamType: 'stdin' });
      const rst = await raw.waitFrame((f) => f.type === 'RST_STREAM' && f.streamId === 3);
      assert.equal(rst.type === 'RST_STREAM' && rst.status, RST_STATUS.REFUSED_STREAM);
      await server.close();
      await new Promise<void>((resolve) => raw.socket.once('end', () => resolve()));
      raw.close();
      await waitFor(isClosed, 2000, 'server close');
    });

    it('handles frames that arrive together with the peer closing the connection', async () => {
      const { raw, streams } = await rawPair();
      await raw.synStream(1, { streamType: 'stdin' });
      raw.send({ type: 'DATA', streamId: 1, flags: 0, data: Buffer.from('last words') });
      raw.send({ type: 'DATA', streamId: 1, flags: FLAG_FIN, data: Buffer.alloc(0) });
      raw.socket.end();
      await waitFor(() => streams.length === 1, 2000, 'stream');
      assert.equal((await readAll(streams[0]!)).toString(), 'last words');
    });

    it('ignores a CREDENTIAL frame and other unknown control frames', async () => {
      const { raw } = await rawPair();
      raw.socket.write(
        encodeFrame({ type: 'UNKNOWN', version: 3, controlType: 10, flags: 0, payload: Buffer.alloc(12) }),
      );
      raw.socket.write(
        encodeFrame({ type: 'UNKNOWN', version: 2, controlType: 1, flags: 0, payload: Buffer.alloc(12) }),
      );
      raw.send({ type: 'PING', flags: 0, id: 9 });
      await raw.waitFrame((f) => f.type === 'PING' && f.id === 9);
      raw.close();
    });
  });
});
