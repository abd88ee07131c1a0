import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { after, describe, it } from 'node:test';
import { type BulkResponse, bulkGet, parseHead, requestHead } from '../../../src/registry/bulk-get.ts';
import { RegistryError } from '../../../src/registry/errors.ts';
import { SlabPool } from '../../../src/registry/slab-pool.ts';

/** A server on loopback; `url` of a path on it. */
interface Server {
  url: (path: string) => URL;
  close: () => Promise<void>;
}

async function listen(server: net.Server): Promise<Server> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  const sockets = new Set<net.Socket>();
  server.on('connection', (s: net.Socket) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  return {
    url: (path) => new URL(`http://127.0.0.1:${port}${path}`),
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A TCP server answering every request with `answer(socket, requestHead)`. */
function rawServer(answer: (socket: net.Socket, head: string) => void): Promise<Server> {
  return listen(
    net.createServer((socket) => {
      let head = '';
      const onData = (b: Buffer) => {
        head += b.toString('latin1');
        if (!head.includes('\r\n\r\n')) return;
        socket.off('data', onData);
        answer(socket, head);
      };
      socket.on('data', onData);
      socket.on('error', () => {});
    }),
  );
}

async function readAll(res: BulkResponse): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of res) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

const get = (url: URL, extra: Partial<Parameters<typeof bulkGet>[0]> = {}) =>
  bulkGet({ url, headers: { 'user-agent': 't' }, idleTimeoutMs: 10_000, pool: new SlabPool(), ...extra });

describe('bulk-get: request and response heads', () => {
  it('the request head: the path and query, host, Connection: close, the headers given', () => {
    const head = requestHead(new URL('http://r.example:5000/v2/x/blobs/sha256:ab?x=1'), {
      authorization: 'Bearer t',
      range: 'bytes=5-',
      Connection: 'keep-alive',
    });
    assert.equal(
      head,
      'GET /v2/x/blobs/sha256:ab?x=1 HTTP/1.1\r\nhost: r.example:5000\r\nconnection: close\r\nauthorization: Bearer t\r\nrange: bytes=5-\r\n\r\n',
    );
  });

  it('a header that would break the message is refused', () => {
    const url = new URL('http://r/');
    assert.throws(() => requestHead(url, { authorization: 'Bearer t\r\nx-evil: 1' }), RegistryError);
    assert.throws(() => requestHead(url, { 'bad name': 'v' }), /request header "bad name"/);
  });

  it('framing: Content-Length, chunked (which wins), to the close, none for 204/304/1xx', () => {
    assert.deepEqual(parseHead('HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-A: 1').framing, {
      kind: 'length',
      left: 12,
    });
    const chunked = parseHead('HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 12');
    assert.deepEqual(chunked.framing, { kind: 'chunked' });
    assert.deepEqual(parseHead('HTTP/1.0 200 OK').framing, { kind: 'close' });
    assert.deepEqual(parseHead('HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip').framing, { kind: 'close' });
    for (const status of [204, 304, 100])
      assert.deepEqual(parseHead(`HTTP/1.1 ${status} X\r\nContent-Length: 5`).framing, {
        kind: 'length',
        left: 0,
      });
    // Repeated equal lengths are one length.
    assert.deepEqual(parseHead('HTTP/1.1 200 OK\r\nContent-Length: 7\r\ncontent-length: 7').framing, {
      kind: 'length',
      left: 7,
    });
  });

  it('status, message and headers (lower-case names, repeats joined)', () => {
    const h = parseHead('HTTP/1.1 307 Temporary Redirect\r\nLocation: /x\r\nVia: a\r\nvia:  b ');
    assert.equal(h.status, 307);
    assert.equal(h.message, 'Temporary Redirect');
    assert.deepEqual(h.headers, { location: '/x', via: 'a, b' });
  });

  it('a malformed head names what is wrong', () => {
    assert.throws(() => parseHead('HTTP/2 200 OK'), /malformed status line "HTTP\/2 200 OK"/);
    assert.throws(
      () => parseHead('HTTP/1.1 200 OK\r\nno colon here'),
      /malformed header line "no colon here"/,
    );
    assert.throws(() => parseHead('HTTP/1.1 200 OK\r\n folded: x'), /malformed header line/);
    assert.throws(
      () => parseHead('HTTP/1.1 200 OK\r\nContent-Length: 5, 6'),
      /invalid Content-Length "5, 6"/,
    );
    assert.throws(() => parseHead('HTTP/1.1 200 OK\r\nContent-Length: -1'), /invalid Content-Length/);
  });
});

describe('bulk-get: bodies', () => {
  const servers: Server[] = [];
  after(async () => {
    for (const s of servers) await s.close();
  });
  const serve = async (s: Promise<Server>) => {
    const server = await s;
    servers.push(server);
    return server;
  };

  it('a Content-Length body of several MiB arrives whole, in slab pieces, and complete', async () => {
    const body = randomBytes(3 * 1024 * 1024 + 5);
    let seen: http.IncomingHttpHeaders = {};
    const server = await serve(
      listen(
        http.createServer((req, res) => {
          seen = req.headers;
          res.writeHead(200, { 'content-length': body.length, 'x-blob': 'yes' });
          res.end(body);
        }),
      ),
    );
    const pool = new SlabPool();
    const res = await get(server.url('/v2/x/blobs/b'), { pool, headers: { authorization: 'Bearer t' } });
    assert.equal(res.statusCode, 200);
    assert.equal(res.headers['x-blob'], 'yes');
    assert.ok((await readAll(res)).equals(body));
    assert.equal(res.complete, true);
    assert.equal(seen.authorization, 'Bearer t');
    assert.equal(seen.connection, 'close');
    assert.ok(pool.made >= 4, `${pool.made} slabs for 3 MiB`);
  });

  it('pieces handed back are read into again, and the bytes stay right', async () => {
    const body = randomBytes(8 * 1024 * 1024);
    const server = await serve(
      listen(
        http.createServer((_req, res) => {
          res.writeHead(200, { 'content-length': body.length });
          res.end(body);
        }),
      ),
    );
    const pool = new SlabPool();
    const res = await get(server.url('/b'), { pool });
    let at = 0;
    for await (const piece of res) {
      const p = piece as Buffer;
      assert.ok(p.equals(body.subarray(at, at + p.length)), `bytes at ${at}`);
      at += p.length;
      pool.release(p);
    }
    assert.equal(at, body.length);
    assert.ok(pool.reused > 0, `reused ${pool.reused}, made ${pool.made}`);
  });

  it('a chunked body (extensions, trailer) is decoded', async () => {
    const parts = [randomBytes(70_000), randomBytes(5), randomBytes(200_000)];
    const server = await serve(
      rawServer((socket) => {
        const wire = [
          'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n',
          ...parts.flatMap((p, i) => [`${p.length.toString(16)}${i === 1 ? ';ext=1' : ''}\r\n`, p, '\r\n']),
          '0\r\nx-trailer: 1\r\n\r\n',
        ];
        // One byte at a time at the start, so that every boundary falls mid-read somewhere.
        const all = Buffer.concat(wire.map((w) => (typeof w === 'string' ? Buffer.from(w, 'latin1') : w)));
        let at = 0;
        const drip = () => {
          if (at < 200) {
            socket.write(all.subarray(at, at + 1));
            at++;
            setImmediate(drip);
          } else socket.write(all.subarray(at));
        };
        drip();
      }),
    );
    const res = await get(server.url('/b'));
    assert.ok((await readAll(res)).equals(Buffer.concat(parts)));
    assert.equal(res.complete, true);
  });

  it('an interim 100 is skipped; a body without a length ends at the close', async () => {
    const body = randomBytes(100_000);
    const server = await serve(
      rawServer((socket) => {
        socket.write('HTTP/1.1 100 Continue\r\n\r\n');
        socket.write('HTTP/1.0 200 OK\r\nX-Kind: close\r\n\r\n');
        socket.end(body);
      }),
    );
    const res = await get(server.url('/b'));
    assert.equal(res.statusCode, 200);
    assert.equal(res.headers['x-kind'], 'close');
    assert.ok((await readAll(res)).equals(body));
    assert.equal(res.complete, true);
  });

  it('an error answer is read like any other (status, JSON body)', async () => {
    const server = await serve(
      listen(
        http.createServer((_req, res) => {
          res.writeHead(404, { 'content-type': 'application/json' });
          res.end('{"errors":[{"code":"BLOB_UNKNOWN"}]}');
        }),
      ),
    );
    const res = await get(server.url('/b'));
    assert.equal(res.statusCode, 404);
    assert.equal((await readAll(res)).toString(), '{"errors":[{"code":"BLOB_UNKNOWN"}]}');
  });

  it('a body cut short fails the stream, says how much was missing, and is not complete', async () => {
    const server = await serve(
      rawServer((socket) => {
        socket.write('HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n');
        socket.end(Buffer.alloc(400));
      }),
    );
    const res = await get(server.url('/b'));
    await assert.rejects(readAll(res), /connection closed with 600 body bytes still to come/);
    assert.equal(res.complete, false);
  });

  it('before any answer: a close, a malformed or oversized head, a refused connection are network errors', async () => {
    const closing = await serve(rawServer((socket) => socket.end()));
    await assert.rejects(get(closing.url('/b')), (e: unknown) => {
      assert.ok(e instanceof RegistryError);
      assert.equal(e.kind, 'network');
      assert.match(e.message, /^GET 127\.0\.0\.1:\d+\/b: connection closed before a response/);
      return true;
    });
    const garbled = await serve(rawServer((socket) => socket.end('SMTP ready\r\n\r\n')));
    await assert.rejects(get(garbled.url('/b')), /malformed status line "SMTP ready"/);
    const huge = await serve(
      rawServer((socket) => socket.write(`HTTP/1.1 200 OK\r\nX-Big: ${'a'.repeat(70_000)}\r\n`)),
    );
    await assert.rejects(get(huge.url('/b')), /response head larger than 65536 bytes/);
    const gone = await serve(rawServer(() => {}));
    const url = gone.url('/b');
    await gone.close();
    await assert.rejects(
      get(url),
      (e: unknown) => e instanceof RegistryError && /ECONNREFUSED/.test(e.message),
    );
  });

  it('a silent server: the idle timeout fails the request', async () => {
    const server = await serve(rawServer(() => {}));
    await assert.rejects(get(server.url('/b'), { idleTimeoutMs: 50 }), /no data for 50 ms/);
  });

  it('an abort before the answer rejects; an abort mid-body fails the stream', async () => {
    let sockets = 0;
    const server = await serve(
      rawServer((socket) => {
        sockets++;
        socket.write('HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n');
        socket.write(Buffer.alloc(1000));
      }),
    );
    const early = new AbortController();
    early.abort(new Error('pod deleted'));
    await assert.rejects(get(server.url('/b'), { signal: early.signal }), /pod deleted/);
    assert.equal(sockets, 0, 'no connection for an aborted request');
    const mid = new AbortController();
    const res = await get(server.url('/b'), { signal: mid.signal });
    const reading = readAll(res);
    mid.abort(new Error('pull cancelled'));
    await assert.rejects(reading, /pull cancelled/);
  });

  it('a slow reader: the socket pauses and every byte still arrives once', async () => {
    const body = randomBytes(6 * 1024 * 1024);
    const server = await serve(
      listen(
        http.createServer((_req, res) => {
          res.writeHead(200, { 'content-length': body.length });
          res.end(body);
        }),
      ),
    );
    const res = await get(server.url('/b'));
    const parts: Buffer[] = [];
    for await (const c of res) {
      parts.push(Buffer.from(c as Buffer));
      await new Promise((resolve) => setImmediate(resolve));
    }
    assert.ok(Buffer.concat(parts).equals(body));
  });
});
