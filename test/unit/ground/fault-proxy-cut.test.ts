// The fault proxy's cut (test/integration/registry-proxy.ts, docs/test-ground.md "Fault proxy"):
// a reset of a connection whose server side already ended is refused by libuv (EINVAL), and Node
// then leaks the socket's handle, so the process spins in its exit. cut() closes such a
// connection instead, and resets any other.
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { cut } from '../../integration/registry-proxy.ts';

describe("the fault proxy's cut", () => {
  let server: net.Server;
  let accepted: (socket: net.Socket) => void = () => {};
  const clients: net.Socket[] = [];

  before(async () => {
    server = net.createServer({ allowHalfOpen: true }, (s) => accepted(s));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  });
  after(async () => {
    for (const c of clients) c.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  });

  /** A connection: the client's socket and the server's. */
  async function connection(): Promise<{ client: net.Socket; server: net.Socket }> {
    const serverSide = new Promise<net.Socket>((resolve) => {
      accepted = resolve;
    });
    const client = net.connect((server.address() as net.AddressInfo).port, '127.0.0.1');
    client.on('error', () => {});
    clients.push(client);
    return { client, server: await serverSide };
  }

  /** Resolves on the socket's close; rejects on its first error. */
  const closed = (s: net.Socket) =>
    new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.once('close', () => resolve());
    });

  it('a connection this side just ended (its shutdown in flight) is closed: no EINVAL, the handle goes', async () => {
    const { server: s } = await connection();
    s.end('bye');
    const done = closed(s);
    cut(s);
    await done;
    assert.equal(s.destroyed, true);
  });

  it('an open connection is reset: the peer sees ECONNRESET', async () => {
    const { client, server: s } = await connection();
    const peer = new Promise<string>((resolve) => {
      client.once('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
      client.once('end', () => resolve('end'));
    });
    const done = closed(s);
    cut(s);
    await done;
    assert.equal(await peer, 'ECONNRESET');
  });
});
