// cocoon-net's control socket for one simulator root (docs/simulator.md, "cocoon-net control
// socket"): HTTP/1.1 on the Unix socket `<root>/net/control.sock`, the one request the
// daemon makes of it, `DELETE /v1/leases/<mac>`, which drops the MAC's lease from the lease
// file at once (204, also when there was none). Anything else is refused as cocoon-net
// refuses it: an unknown path 404, another method 405, a malformed MAC 400. Every request is
// recorded in `<root>/sim/net-control.jsonl` ({at, method, path, status, released}) for tests.
// Served by the root's simulator server (sim/server.ts) for as long as it runs.
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { guestNetChange } from './guestnet.ts';
import { loadKnobs } from './knobs.ts';
import { LEASE_MAC, leaseOptions, releaseIn, updateLeases } from './leases.ts';

/** Where a root's control socket lives. */
export const netControlSocket = (root: string) => path.join(root, 'net', 'control.sock');
/** The record of every request. */
export const netControlLog = (root: string) => path.join(root, 'sim', 'net-control.jsonl');

const LEASE_PATH = /^\/v1\/leases\/([^/?]+)$/;

export interface NetControlRecord {
  at: string;
  method: string;
  path: string;
  status: number;
  /** The MAC a lease request names (decoded, lower case). */
  mac?: string;
  /** Leases removed by a DELETE. */
  released?: number;
}

/** Starts serving; resolves once listening, or with undefined (logged) when it cannot. */
export async function startNetControl(
  root: string,
  leasesPath: string,
  log: (msg: string) => void,
): Promise<http.Server | undefined> {
  const socket = netControlSocket(root);
  fs.mkdirSync(path.dirname(socket), { recursive: true });
  fs.rmSync(socket, { force: true }); // a socket file left by a killed server
  const record = (r: NetControlRecord) => fs.appendFileSync(netControlLog(root), `${JSON.stringify(r)}\n`);
  const server = http.createServer((req, res) => {
    const method = req.method ?? '';
    const url = req.url ?? '';
    let mac: string | undefined;
    const answer = (status: number, released?: number) => {
      record({
        at: new Date().toISOString(),
        method,
        path: url,
        status,
        ...(mac === undefined ? {} : { mac }),
        ...(released === undefined ? {} : { released }),
      });
      res.writeHead(status, status === 204 ? {} : { 'content-type': 'text/plain' });
      res.end(status === 204 ? undefined : `${http.STATUS_CODES[status] ?? 'error'}\n`);
    };
    req.resume();
    const m = LEASE_PATH.exec(url);
    if (!m) return answer(404);
    if (method !== 'DELETE') return answer(405);
    const asked = decodeURIComponent(m[1] ?? '').toLowerCase();
    mac = asked;
    if (!LEASE_MAC.test(asked)) return answer(400);
    loadKnobs(root)
      .then((knobs) =>
        answer(
          204,
          updateLeases(leasesPath, leaseOptions(knobs), (list) => {
            const ips = list.filter((l) => l.mac.toLowerCase() === asked).map((l) => l.ip);
            const n = releaseIn(list, asked);
            guestNetChange(root, { del: ips }); // a guest without its lease stops answering
            return n;
          }),
        ),
      )
      .catch((err: unknown) => {
        log(`net control: DELETE ${asked}: ${(err as Error).message}`);
        answer(500);
      });
  });
  return new Promise((resolve) => {
    server.once('error', (err) => {
      log(`net control: cannot listen on ${socket}: ${err.message}`);
      resolve(undefined);
    });
    server.listen(socket, () => resolve(server));
  });
}
