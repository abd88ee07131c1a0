// The kubelet HTTPS server's own rules (docs/contracts/virtual-node.md "Kubelet API"): a
// WebSocket and a SPDY exec are authorized as `create` (a `get`-only caller gets 403 before
// any upgrade), an exec is logged with pod, container and user but never its argv, the
// connection cap closes the connections over it and counts them, and the server without
// authentication listens on loopback only.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { request } from 'node:https';
import { Writable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { type TLSSocket, connect as tlsConnect } from 'node:tls';
import WebSocket from 'ws';
import type { Kube } from '../../../src/kube/client.ts';
import { KubeletAuthorizer } from '../../../src/kubelet/auth.ts';
import type { ContainerAccess } from '../../../src/kubelet/ports.ts';
import { KubeletServer, type KubeletServerOptions } from '../../../src/kubelet/server.ts';
import { createLogger, silentLogger } from '../../../src/log.ts';
import { issue, makeCa, type Pair } from '../fakes/pki.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('framework/kubelet-server-hardening', () => {
  let serving: Pair;
  const SECRET = 'hunter2-s3cr3t';

  before(async () => {
    const ca = await makeCa('CN=test-ca');
    serving = await issue(ca, 'CN=vk-test', 'server', [{ type: 'ip', value: '127.0.0.1' }]);
  });

  /** A provider whose exec succeeds at once and remembers the argv it was given. */
  function provider(argvs: string[][]): ContainerAccess {
    return {
      getContainerLogs: () => Promise.reject(new Error('not used')),
      runInContainer: async (_ns, _pod, _c, cmd) => {
        argvs.push(cmd);
        return { kind: 'success' };
      },
    };
  }

  function server(over: Partial<KubeletServerOptions>): KubeletServer {
    return new KubeletServer({
      port: 0,
      host: '127.0.0.1',
      cert: serving.cert,
      key: serving.key,
      clientCa: undefined,
      authorize: async () => ({ ok: true, user: { name: 'alice', groups: [] } }),
      provider: provider([]),
      nodePods: () => [],
      runningPods: () => [],
      streamIdleTimeoutMs: 60_000,
      log: silentLogger,
      ...over,
    });
  }

  const EXEC_PATH = `/exec/ns/pod/c?command=sh&command=-c&command=${SECRET}&output=1`;

  /** A WebSocket exec; resolves with the HTTP status of a refused upgrade or 101. */
  function wsExec(port: number, token?: string): Promise<{ status: number; body: string }> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(`wss://127.0.0.1:${port}${EXEC_PATH}`, ['v5.channel.k8s.io'], {
        rejectUnauthorized: false,
        headers: token ? { authorization: `Bearer ${token}` } : {},
      });
      ws.on('unexpected-response', (_req, res) => {
        let body = '';
        res.on('data', (c: Buffer) => {
          body += c.toString();
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      });
      ws.on('open', () => ws.on('close', () => resolve({ status: 101, body: '' })));
      ws.on('error', (err) => {
        if (!/Unexpected server response/.test(err.message)) reject(err);
      });
    });
  }

  /** A SPDY exec upgrade (POST, as kubectl and the apiserver send it); resolves with the status. */
  function spdyExec(port: number, token: string): Promise<{ status: number; body: string }> {
    return new Promise((resolve, reject) => {
      const req = request({
        host: '127.0.0.1',
        port,
        path: EXEC_PATH,
        method: 'POST',
        rejectUnauthorized: false,
        agent: false,
        headers: {
          authorization: `Bearer ${token}`,
          connection: 'Upgrade',
          upgrade: 'SPDY/3.1',
          'x-stream-protocol-version': 'v4.channel.k8s.io',
        },
      });
      req.on('response', (res) => {
        let body = '';
        res.on('data', (c: Buffer) => {
          body += c.toString();
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      });
      req.on('upgrade', (res, socket) => {
        socket.destroy();
        resolve({ status: res.statusCode ?? 0, body: '' });
      });
      req.on('error', reject);
      req.end();
    });
  }

  describe('exec authorization through the server', () => {
    let s: KubeletServer;
    const sars: string[] = [];
    const argvs: string[][] = [];

    before(async () => {
      // Tokens: `getter` may only `get` nodes/proxy, `creator` may `create` it.
      const kube = {
        authn: {
          createTokenReview: async ({ body }: { body: { spec: { token: string } } }) => ({
            status: { authenticated: true, user: { username: body.spec.token } },
          }),
        },
        authz: {
          createSubjectAccessReview: async ({
            body,
          }: {
            body: { spec: { user: string; resourceAttributes: { verb: string } } };
          }) => {
            const { user, resourceAttributes } = body.spec;
            sars.push(`${user} ${resourceAttributes.verb}`);
            return {
              status: {
                allowed:
                  user === 'creator'
                    ? resourceAttributes.verb === 'create'
                    : resourceAttributes.verb === 'get',
              },
            };
          },
        },
      } as unknown as Kube;
      const authz = new KubeletAuthorizer(kube, 'node-a');
      s = server({ authorize: (req) => authz.decide(req), provider: provider(argvs) });
      await s.listen();
    });

    after(() => s.close());

    it('answers 403 to a get-only caller for a WebSocket (GET) and a SPDY (POST) exec', async () => {
      const ws = await wsExec(s.port, 'getter');
      assert.equal(ws.status, 403);
      assert.match(ws.body, /user=getter, verb=create, resource=nodes, subresource=proxy/);
      const spdy = await spdyExec(s.port, 'getter');
      assert.equal(spdy.status, 403);
      assert.deepEqual(argvs, [], 'nothing ran');
      assert.ok(
        sars.every((l) => l === 'getter create'),
        sars.join(', '),
      );
    });

    it('runs the exec for a caller allowed to create nodes/proxy', async () => {
      assert.equal((await wsExec(s.port, 'creator')).status, 101);
      assert.equal((await spdyExec(s.port, 'creator')).status, 101);
      assert.deepEqual(argvs[0], ['sh', '-c', SECRET]);
    });
  });

  describe('exec logging', () => {
    it('logs pod, container, user and transport, never the command line', async () => {
      const lines: Record<string, unknown>[] = [];
      const sink = new Writable({
        write(chunk: Buffer, _enc, done) {
          for (const l of chunk.toString().split('\n').filter(Boolean)) lines.push(JSON.parse(l));
          done();
        },
      });
      const argvs: string[][] = [];
      const s = server({ provider: provider(argvs), log: createLogger('trace', sink) });
      await s.listen();
      try {
        assert.equal((await wsExec(s.port)).status, 101);
      } finally {
        await s.close();
      }
      assert.deepEqual(argvs, [['sh', '-c', SECRET]], 'the command did run');
      const exec = lines.filter((l) => l.msg === 'exec');
      assert.equal(exec.length, 1);
      assert.equal(exec[0]?.pod, 'ns/pod');
      assert.equal(exec[0]?.container, 'c');
      assert.equal(exec[0]?.user, 'alice');
      assert.equal(exec[0]?.transport, 'websocket');
      assert.equal(exec[0]?.command, undefined);
      assert.doesNotMatch(JSON.stringify(lines), new RegExp(SECRET));
    });
  });

  describe('connection cap', () => {
    /** Opens a TLS connection; resolves once the handshake is done, or 'dropped' when the
     * server closed it first. */
    function open(port: number): Promise<TLSSocket | 'dropped'> {
      return new Promise((resolve) => {
        const sock = tlsConnect({ host: '127.0.0.1', port, rejectUnauthorized: false });
        sock.once('secureConnect', () => resolve(sock));
        sock.once('error', () => {});
        sock.once('close', () => resolve('dropped'));
      });
    }

    it('closes connections over VK_KUBELET_MAX_CONNECTIONS at once and counts them', async () => {
      let dropped = 0;
      const s = server({ maxConnections: 2, onConnectionDropped: () => dropped++ });
      await s.listen();
      const held: TLSSocket[] = [];
      try {
        for (let i = 0; i < 2; i++) {
          const c = await open(s.port);
          assert.notEqual(c, 'dropped', `connection ${i + 1} of 2`);
          held.push(c as TLSSocket);
        }
        assert.equal(await open(s.port), 'dropped');
        assert.equal(await open(s.port), 'dropped');
        assert.equal(dropped, 2);
        // A freed slot is usable again (the server sees the close a moment later: retry a
        // bounded number of times, each waiting for the outcome of a real connection).
        const first = held.shift() as TLSSocket;
        first.destroy();
        await once(first, 'close');
        let again: TLSSocket | 'dropped' = 'dropped';
        for (let attempt = 0; attempt < 100 && again === 'dropped'; attempt++) again = await open(s.port);
        assert.notEqual(again, 'dropped');
        held.push(again as TLSSocket);
      } finally {
        for (const c of held) c.destroy();
        await s.close();
      }
    });
  });

  describe('without authentication', () => {
    it('refuses to listen on anything but loopback', async () => {
      for (const host of [undefined, '0.0.0.0', '::', '10.1.2.3']) {
        const s = server({ authorize: undefined, ...(host === undefined ? { host: undefined } : { host }) });
        await assert.rejects(s.listen(), /VK_KUBELET_AUTH=none.*only a loopback address/, String(host));
      }
      const s = server({ authorize: undefined, host: '127.0.0.1' });
      await s.listen();
      assert.ok(s.port > 0);
      await s.close();
    });
  });
});
