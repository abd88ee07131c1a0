// TLS on the peer port (docs/peer-restore.md "Where we differ from Go"): the pinned server
// certificate, client certificates checked by the injected policy, plain HTTP beside TLS only
// when allowed.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { PeerClient, type PeerRestoreError, type PeerRestoreOptions } from '../../../src/peer/client.ts';
import { nodeFromCert, type PeerCaller, type PeerServer } from '../../../src/peer/server.ts';
import { type Pki, snapshotConfig, startPeer, tempDir, testPki } from './helpers.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('peer/tls', () => {
  const tmp = tempDir();
  after(() => tmp.cleanup());
  const store = join(tmp.dir, 'store');
  const client = new PeerClient();
  let pki: Pki;
  let roots = 0;
  const callers: PeerCaller[] = [];

  /** The policy a provider would give: a verified node certificate, else 401. */
  async function nodePolicy(who: PeerCaller) {
    callers.push(who);
    const node = nodeFromCert(who);
    return node
      ? { ok: true as const, node }
      : { ok: false as const, status: 401 as const, message: 'a node client certificate is required' };
  }

  async function failure(p: Promise<unknown>): Promise<PeerRestoreError> {
    try {
      await p;
    } catch (err) {
      assert.equal((err as Error).name, 'PeerRestoreError', (err as Error).stack);
      return err as PeerRestoreError;
    }
    assert.fail('the restore succeeded');
  }

  describe('peer restore over TLS', () => {
    let server: PeerServer;
    let stop: () => Promise<void>;
    let https = '';
    before(async () => {
      pki = await testPki();
      mkdirSync(join(store, 'SNAP-1'), { recursive: true });
      writeFileSync(join(store, 'SNAP-1', 'state.json'), '{"vm":"a"}');
      const p = await startPeer({
        storeDir: store,
        resolve: async (name) => (name === 'vm-a' ? { id: 'SNAP-1' } : 'absent'),
        authorize: nodePolicy,
        allowPlainHttp: false,
      });
      server = p.server;
      stop = p.stop;
      https = `https://127.0.0.1:${server.port}`;
    });
    after(() => stop());

    const restore = (o: Partial<PeerRestoreOptions>) =>
      client.restore({
        baseUrl: https,
        pinSha256: pki.pin,
        clientCert: { cert: pki.node.cert, key: pki.node.key },
        vmName: 'vm-a',
        config: snapshotConfig('SNAP-1'),
        stagingRoot: join(tmp.dir, `staging-${++roots}`),
        ...o,
      });

    it('restores with a pinned server and a verified node certificate', async () => {
      callers.length = 0;
      const r = await restore({});
      assert.equal(readFileSync(join(r.dir, 'state.json'), 'utf8'), '{"vm":"a"}');
      await r.release();
      assert.deepEqual(callers[0], {
        transport: 'tls',
        certCn: 'system:node:n1',
        certGroups: ['system:nodes'],
        certVerified: true,
        remoteAddress: '127.0.0.1',
      });
    });

    it('accepts the pin with colons and in upper case', async () => {
      const colons = pki.pin.toUpperCase().replace(/(..)(?!$)/g, '$1:');
      const r = await restore({ pinSha256: colons });
      await r.release();
    });

    it('refuses a server whose certificate is not the pinned one, before sending a request', async () => {
      callers.length = 0;
      const stagingRoot = join(tmp.dir, 'pin-mismatch');
      const err = await failure(restore({ pinSha256: 'ab'.repeat(32), stagingRoot }));
      assert.equal(err.reason, 'tls');
      assert.match(err.message, /does not match the pin/);
      assert.equal(callers.length, 0, 'no request reached the server');
      assert.equal(existsSync(stagingRoot), false);
    });

    it('requires a pin for https', async () => {
      const err = await failure(restore({ pinSha256: undefined }));
      assert.equal(err.reason, 'tls');
    });

    it('answers 401 to a client without a certificate, or with one from another CA', async () => {
      callers.length = 0;
      const none = await failure(restore({ clientCert: undefined }));
      assert.equal(none.reason, 'plan');
      assert.match(none.message, /HTTP 401 Unauthorized: a node client certificate is required/);
      const stranger = await failure(
        restore({ clientCert: { cert: pki.stranger.cert, key: pki.stranger.key } }),
      );
      assert.match(stranger.message, /HTTP 401/);
      assert.deepEqual(
        callers.map((c) => c.transport === 'tls' && [c.certVerified, c.certCn ?? null]),
        [
          [false, null],
          [false, 'system:node:n1'],
        ],
      );
    });

    it('closes plain-HTTP connections on this server', async () => {
      const err = await failure(restore({ baseUrl: `http://127.0.0.1:${server.port}` }));
      assert.equal(err.reason, 'plan');
      assert.match(err.message, /socket hang up|ECONNRESET/);
    });
  });

  describe('one port, both protocols', () => {
    it('serves a Go (plain) client and a TLS client when plain HTTP is allowed', async () => {
      pki = await testPki();
      const dir = join(tmp.dir, 'both');
      mkdirSync(join(dir, 'SNAP-1'), { recursive: true });
      writeFileSync(join(dir, 'SNAP-1', 'f'), 'data');
      const seen: string[] = [];
      const p = await startPeer({
        storeDir: dir,
        allowPlainHttp: true,
        resolve: async () => ({ id: 'SNAP-1' }),
        authorize: async (who) => {
          seen.push(who.transport);
          return { ok: true, node: who.transport === 'tls' ? (nodeFromCert(who) ?? '?') : who.remoteAddress };
        },
      });
      try {
        const common = {
          vmName: 'vm-a',
          config: snapshotConfig('SNAP-1'),
          stagingRoot: join(dir, 'staging'),
        };
        const plain = await client.restore({ ...common, baseUrl: p.base });
        const tls = await client.restore({
          ...common,
          baseUrl: `https://127.0.0.1:${p.server.port}`,
          pinSha256: pki.pin,
          clientCert: { cert: pki.node.cert, key: pki.node.key },
        });
        assert.equal(readFileSync(join(plain.dir, 'f'), 'utf8'), 'data');
        assert.equal(readFileSync(join(tls.dir, 'f'), 'utf8'), 'data');
        assert.deepEqual(seen, ['plain', 'plain', 'tls', 'tls']);
        await plain.release();
        await tls.release();
      } finally {
        await p.stop();
      }
    });
  });

  describe('nodeFromCert', () => {
    const tls = (certCn: string | undefined, certGroups: string[], certVerified = true): PeerCaller => ({
      transport: 'tls',
      ...(certCn === undefined ? {} : { certCn }),
      certGroups,
      certVerified,
      remoteAddress: '10.0.0.1',
    });

    it('names the node of a verified kubelet-style certificate only', () => {
      assert.equal(nodeFromCert(tls('system:node:n1', ['system:nodes'])), 'n1');
      assert.equal(nodeFromCert(tls('system:node:n1', ['system:nodes'], false)), undefined);
      assert.equal(nodeFromCert(tls('system:node:n1', ['other'])), undefined);
      assert.equal(nodeFromCert(tls('system:node:', ['system:nodes'])), undefined);
      assert.equal(nodeFromCert(tls('admin', ['system:nodes'])), undefined);
      assert.equal(nodeFromCert(tls(undefined, ['system:nodes'])), undefined);
      assert.equal(nodeFromCert({ transport: 'plain', remoteAddress: '10.0.0.1' }), undefined);
    });
  });
});
