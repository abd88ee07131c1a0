// This host's peer restore (src/node/peer-host.ts) in process, on real sockets with a fake
// cocoon runner and fake Kubernetes client: what a push stamps (the node IP for a wildcard
// listen address, the pin of a certificate kept across restarts), who may read (a node client
// certificate of the cluster CA; plain HTTP only from VK_PEER_PLAIN_HTTP's networks) and what is
// served (only the hibernated state the ledger says this daemon saved), end to end through
// another host's restore.
import assert from 'node:assert/strict';
import { createHash, X509Certificate } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { freePort } from '../../../ground/proc.ts';
import { Ledger } from '../../../src/authority/ledger.ts';
import { parsePeerConfig } from '../../../src/config/peer.ts';
import { silentLogger } from '../../../src/log.ts';
import { createMetrics } from '../../../src/metrics/registry.ts';
import { PeerHost } from '../../../src/node/peer-host.ts';
import { FakeCocoon } from '../fakes/cocoon.ts';
import { fakeKube } from '../fakes/kube.ts';
import { issue, makeCa, type Pair } from '../fakes/pki.ts';
import { snapshotConfig, tempDir } from '../peer/helpers.ts';

// One describe per file: the unit job runs every file in one process (--test-isolation=none,
// ground/run-tests.ts), where a file's top-level hooks would run around every other file's tests.
describe('node/peer-host', () => {
  const OWNER = { namespace: 'ns', vmName: 'vk-a', controllerUid: 'set-1' };
  const POD = { key: 'ns/a', uid: 'uid-a' };
  let ca: Pair;
  let nodeB: Pair;
  const tmp = tempDir('peer-host-');
  after(() => tmp.cleanup());

  before(async () => {
    ca = await makeCa('CN=cluster-ca');
    nodeB = await issue(ca, 'CN=system:node:host-b, O=system:nodes', 'client');
  });

  async function host(name: string, env: Record<string, string>, clientCert?: Pair) {
    const dir = join(tmp.dir, name);
    const cocoon = new FakeCocoon();
    const ledger = Ledger.memory(name, silentLogger);
    const problems: string[] = [];
    const config = parsePeerConfig(
      (k) =>
        ({
          VK_STAGING_DIR: join(dir, 'staging'),
          VK_COCOON_SNAPSHOT_DIR: join(dir, 'snapshots'),
          ...env,
        })[k],
      problems,
    );
    assert.deepEqual(problems, []);
    const lifetime = new AbortController();
    const h = new PeerHost({
      config,
      nodeName: name,
      kube: fakeKube().kube,
      cli: cocoon.cli,
      ledger,
      stateDir: join(dir, 'state'),
      nodeIP: '127.0.0.1',
      clientCa: ca.cert,
      clientCert: clientCert && { cert: clientCert.cert, key: clientCert.key },
      maxStagedBytes: 2 ** 30,
      metrics: createMetrics().peer,
      lifetime: lifetime.signal,
      log: silentLogger,
    });
    await h.start();
    return {
      h,
      cocoon,
      ledger,
      dir,
      close: async () => {
        await h.close();
        lifetime.abort();
      },
    };
  }

  describe('PeerHost', () => {
    test('a wildcard listen address stamps the node IP; the pin is of the kept certificate, the same after a restart', async () => {
      const port = await freePort();
      const a = await host('host-a', { VK_PEER_ADDR: `:${port}` });
      const pem = readFileSync(join(a.dir, 'state', 'peer.crt'), 'utf8');
      const pin = createHash('sha256').update(new X509Certificate(pem).raw).digest('hex');
      assert.deepEqual(a.h.stamp, { address: `127.0.0.1:${port}`, pin });
      await a.close();
      const again = await host('host-a', { VK_PEER_ADDR: `:${port}` });
      assert.equal(again.h.stamp?.pin, pin, 'the pin outlives a restart');
      await again.close();
      const off = await host('host-off', { VK_PEER_ADDR: '' });
      assert.equal(off.h.stamp, undefined);
      assert.deepEqual(
        await off.h.restore({
          vmName: 'vk-a',
          fromNode: 'x',
          config: snapshotConfig('S'),
          log: silentLogger,
        }),
        {
          skip: 'peer restore is disabled (VK_PEER_ADDR is empty)',
        },
      );
      await off.close();
    });

    test("another host restores the ledger's hibernated state with its node certificate; a snapshot the ledger does not give is absent", async () => {
      const a = await host('host-a2', { VK_PEER_ADDR: `127.0.0.1:${await freePort()}` });
      const b = await host('host-b', { VK_PEER_ADDR: `127.0.0.1:${await freePort()}` }, nodeB);
      try {
        // A hibernate saved vk-a on A (its ledger), and a clone source sits beside it.
        a.cocoon.snapshot('vk-a');
        a.cocoon.snapshot('acme/source');
        for (const id of ['snap-vk-a', 'snap-acme/source'.replace('/', '_')]) {
          mkdirSync(join(a.dir, 'snapshots', id), { recursive: true });
          writeFileSync(join(a.dir, 'snapshots', id, 'memory-range-0'), `guest memory of ${id}`);
        }
        await a.ledger.intend('snapshot', 'vk-a', OWNER, POD);
        await a.ledger.confirm('snapshot', 'vk-a', 'snap-vk-a', OWNER, POD);
        const stamp = a.h.stamp;
        assert.ok(stamp);
        const r = await b.h.restore({
          vmName: 'vk-a',
          fromNode: 'host-a2',
          stamp,
          config: snapshotConfig('snap-vk-a'),
          log: silentLogger,
        });
        assert.ok('dir' in r, JSON.stringify(r));
        assert.equal(readFileSync(join(r.dir, 'memory-range-0'), 'utf8'), 'guest memory of snap-vk-a');
        await r.release();
        assert.deepEqual(readdirSync(join(b.dir, 'staging')), []);
        // Not a hibernated state of this daemon's: answered as absent, never served.
        await assert.rejects(
          b.h.restore({
            vmName: 'acme/source',
            fromNode: 'host-a2',
            stamp,
            config: snapshotConfig('snap-acme/source'),
            log: silentLogger,
          }),
          /404/,
        );
        // A wrong pin: refused before any request.
        await assert.rejects(
          b.h.restore({
            vmName: 'vk-a',
            fromNode: 'host-a2',
            stamp: { ...stamp, pin: '00'.repeat(32) },
            config: snapshotConfig('snap-vk-a'),
            log: silentLogger,
          }),
        );
      } finally {
        await a.close();
        await b.close();
      }
    });

    test('without a node certificate a host is refused (401); plain HTTP is answered only from the listed networks', async () => {
      const port = await freePort();
      const a = await host('host-a3', {
        VK_PEER_ADDR: `127.0.0.1:${port}`,
        VK_PEER_PLAIN_HTTP: '10.0.0.0/8',
      });
      const c = await host('host-c', { VK_PEER_ADDR: `127.0.0.1:${await freePort()}` });
      try {
        a.cocoon.snapshot('vk-a');
        await a.ledger.intend('snapshot', 'vk-a', OWNER, POD);
        await a.ledger.confirm('snapshot', 'vk-a', 'snap-vk-a', OWNER, POD);
        await assert.rejects(
          c.h.restore({
            vmName: 'vk-a',
            fromNode: 'host-a3',
            stamp: a.h.stamp,
            config: snapshotConfig('snap-vk-a'),
            log: silentLogger,
          }),
          /401/,
        );
        const plain = await fetch(`http://127.0.0.1:${port}/v1/snapshot-plan?name=vk-a`).then(
          (res) => res.status,
          () => 0,
        );
        assert.equal(plain, 403, '127.0.0.1 is not in 10.0.0.0/8');
      } finally {
        await a.close();
        await c.close();
      }
    });
  });
});
