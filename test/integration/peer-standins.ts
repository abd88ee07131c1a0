// Stand-in peers for the fleet tests, each serving a host's real snapshot store with a
// PeerServer of the test's.
//
// A Go pusher (`goPusher`): plain HTTP on another loopback address at the fleet's peer port, as
// a Go host serves; found, as Go finds it, through a Node object whose InternalIP is that address.
//
// A faulty peer (`faultyPeer`): a host's peer server seen through a TLS front that holds
// the host's own peer certificate (so the pin our pushes stamp still matches) and forwards each
// connection, byte for byte, to a PeerServer of the test's serving that host's snapshot store.
// The front damages what the server sends after a connection's first slice request: `corrupt`
// flips that slice's first body byte (the CRC-32C trailer no longer matches), `stall` sends nothing
// after its headers (the client's stall timeout cuts it). Everything else passes unchanged.
import { readFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import tls from 'node:tls';
import type { FleetHost } from '../../ground/fleet.ts';
import { type PeerResult, type PeerRoute, PeerServer } from '../../src/peer/server.ts';

export type PeerFault = 'corrupt' | 'stall';

export interface FaultyPeer {
  /** `ip:port` to stamp into a manifest as the peer address. */
  address: string;
  /** Slice responses the front damaged. */
  damaged(): number;
  close(): Promise<void>;
}

/** A PeerServer of the test's for `host`'s snapshot `name` (only that one is served). */
async function servingHost(
  host: FleetHost,
  name: string,
  o: { listen: { host: string; port: number }; requests?: (route: PeerRoute, result: PeerResult) => void },
): Promise<{ server: PeerServer; tls: { cert: string; key: string } }> {
  const info = JSON.parse((await host.simulator.run(['snapshot', 'inspect', name])).stdout) as { id: string };
  const stateDir = join(host.simRoot, 'vk-state');
  const tlsPair = {
    cert: readFileSync(join(stateDir, 'peer.crt'), 'utf8'),
    key: readFileSync(join(stateDir, 'peer.key'), 'utf8'),
  };
  const server = new PeerServer({
    listen: o.listen,
    tls: tlsPair,
    storeDir: host.snapshotDir,
    resolve: async (asked) => (asked === name ? { id: info.id } : 'absent'),
    authorize: async () => ({ ok: true, node: 'test' }),
    allowPlainHttp: true,
    metrics: {
      streamsInUse: () => {},
      bytesServed: () => {},
      request: (route, result) => o.requests?.(route, result),
      refused: () => {},
    },
  });
  await server.start();
  return { server, tls: tlsPair };
}

export interface GoPusher {
  /** Requests served, as `<route> <result>`. */
  requests: string[];
  close(): Promise<void>;
}

/** Serves `host`'s snapshot `name` over plain HTTP on `ip:port`, as a Go host would. */
export async function goPusher(host: FleetHost, name: string, ip: string, port: number): Promise<GoPusher> {
  const requests: string[] = [];
  const { server } = await servingHost(host, name, {
    listen: { host: ip, port },
    requests: (route, result) => requests.push(`${route} ${result}`),
  });
  return { requests, close: () => server.close() };
}

/** Starts the front on `host.ip` (a free port) for `host`'s snapshot `name`. */
export async function faultyPeer(host: FleetHost, name: string, fault: PeerFault): Promise<FaultyPeer> {
  const { server: upstream, tls: tlsPair } = await servingHost(host, name, {
    listen: { host: '127.0.0.1', port: 0 },
  });
  let damaged = 0;
  const sockets = new Set<net.Socket>();
  const front = tls.createServer(tlsPair, (client) => {
    const up = net.connect(upstream.port, '127.0.0.1');
    sockets.add(client).add(up);
    let slice = false;
    let done = false;
    let held = Buffer.alloc(0);
    client.on('data', (d: Buffer) => {
      if (d.includes('/v1/snapshot-slice')) slice = true;
      up.write(d);
    });
    up.on('data', (d: Buffer) => {
      if (!slice || done) {
        // After a stall nothing more reaches the client; after one corruption all passes.
        if (!(done && fault === 'stall')) client.write(d);
        return;
      }
      held = Buffer.concat([held, d]);
      const headersEnd = held.indexOf('\r\n\r\n');
      if (headersEnd < 0) return;
      if (fault === 'stall') {
        // The headers arrive, the body never does.
        client.write(held.subarray(0, headersEnd + 4));
      } else {
        // The first body byte: after the headers and the first chunk-size line.
        const sizeEnd = held.indexOf('\r\n', headersEnd + 4);
        if (sizeEnd < 0 || held.length <= sizeEnd + 2) return;
        held[sizeEnd + 2] = (held[sizeEnd + 2] as number) ^ 0xff;
        client.write(held);
      }
      damaged++;
      done = true;
      held = Buffer.alloc(0);
    });
    const end = () => {
      client.destroy();
      up.destroy();
      sockets.delete(client);
      sockets.delete(up);
    };
    client.on('error', end);
    client.on('close', end);
    // A stalled client keeps its connection when the server behind closes its own (its
    // keep-alive timeout): the client must see silence, not a reset.
    const upEnd = () => (fault === 'stall' && done ? up.destroy() : end());
    up.on('error', upEnd);
    up.on('close', upEnd);
  });
  await new Promise<void>((resolve) => front.listen(0, host.ip, resolve));
  const port = (front.address() as net.AddressInfo).port;
  return {
    address: `${host.ip}:${port}`,
    damaged: () => damaged,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => front.close(() => resolve()));
      await upstream.close();
    },
  };
}
