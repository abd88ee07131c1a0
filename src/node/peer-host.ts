// This host's side of peer restore (docs/peer-restore.md), wired from src/main.ts: the server of
// its hibernated state to the other hosts of the cluster, and the restorer a wake asks for the
// state of a VM name from the host that pushed it (the provider's PeerRestorer port, by shape).
//
// Who may read: a caller proves a node identity with its client certificate (CN
// `system:node:<name>`, group `system:nodes`, signed by the cluster's client CA): what the
// apiserver itself trusts; a pod or a guest has no such certificate. Plain HTTP (Go hosts) is
// answered only from the networks VK_PEER_PLAIN_HTTP lists. What is served: only the hibernated
// state this daemon saved (its ledger), never a clone source, a fork or another snapshot.
// Who is asked: our pushes stamp the manifest with this host's peer address and the SHA-256 of
// its peer certificate (kept in VK_STATE_DIR, so the pin outlives a restart); a waking host dials
// that address over TLS pinned to that hash. A state without the stamp was pushed by a Go host:
// its Node's InternalIP at this host's peer port, over plain HTTP, as Go does (a node identity
// may not read other Node objects on Kubernetes 1.32+; the wake then pulls from the registry).
// Every byte is checked by its CRC-32C and the snapshot by the registry's id either way.
import { X509Certificate } from 'node:crypto';
import { chmod, mkdir, readFile, writeFile } from 'node:fs/promises';
import { BlockList, isIPv6 } from 'node:net';
import { join } from 'node:path';
import type { V1Node } from '@kubernetes/client-node';
import type { Ledger } from '../authority/ledger.ts';
import { entryOwns } from '../authority/rules.ts';
import type { CocoonCli } from '../cocoon/runner.ts';
import { inspectSnapshot } from '../cocoon/snapshots.ts';
import type { PeerConfig } from '../config/peer.ts';
import { apiErrorMessage, apiStatus, type Kube } from '../kube/client.ts';
import { loadOrCreateServingCert } from '../kubelet/tls.ts';
import type { Logger } from '../log.ts';
import type { PeerMetrics } from '../metrics/registry.ts';
import { PeerClient, sweepStaging } from '../peer/client.ts';
import { nodeFromCert, type PeerCaller, PeerServer } from '../peer/server.ts';
import { certSha256 } from '../peer/transport.ts';
import { stagedBytesBound } from '../peer/wire.ts';
import type { SnapshotConfig } from '../registry/artifact-config.ts';

export interface PeerHostOptions {
  config: PeerConfig;
  nodeName: string;
  kube: Kube;
  cli: CocoonCli;
  /** What the server may hand out: only the hibernated state this daemon saved (its ledger). */
  ledger: Ledger;
  /** VK_STATE_DIR: the peer certificate and key live here (peer.crt, peer.key; 0600). */
  stateDir: string;
  /** This host's node IP: the address pushes stamp when VK_PEER_ADDR has no host. */
  nodeIP: string;
  /** The cluster's client CA (PEM), which signs node client certificates. */
  clientCa: string | undefined;
  /** This host's client certificate (the kubeconfig's node identity), presented to peers. */
  clientCert: { cert: string; key: string } | undefined;
  /** Bytes a restore may stage at most. */
  maxStagedBytes: number;
  metrics: PeerMetrics;
  lifetime: AbortSignal;
  log: Logger;
}

export class PeerHost {
  readonly #o: PeerHostOptions;
  readonly #log: Logger;
  readonly #client: PeerClient;
  readonly #plainFrom = new BlockList();
  #server: PeerServer | undefined;
  #cert: { cert: string; key: string } | undefined;
  /** This host's peer server as pushes stamp it (set by start; undefined: no server). */
  stamp: { address: string; pin: string } | undefined;

  constructor(o: PeerHostOptions) {
    this.#o = o;
    this.#log = o.log.child({ module: 'peer' });
    this.#client = new PeerClient();
    for (const cidr of o.config.plainHttp) {
      const [ip = '', bits = ''] = cidr.split('/');
      this.#plainFrom.addSubnet(ip, Number(bits), isIPv6(ip) ? 'ipv6' : 'ipv4');
    }
  }

  /** The peer certificate, made once and kept in the state directory: the pin pushes stamp
   * stays valid across restarts (a new one would send every wake to the registry). */
  async #loadCert(): Promise<{ cert: string; key: string }> {
    const certPath = join(this.#o.stateDir, 'peer.crt');
    const keyPath = join(this.#o.stateDir, 'peer.key');
    const made = await loadOrCreateServingCert(certPath, keyPath, {
      dns: [this.#o.nodeName],
      ips: [this.#o.nodeIP],
    });
    if (made.selfSigned) {
      await mkdir(this.#o.stateDir, { recursive: true, mode: 0o700 });
      await writeFile(keyPath, made.key, { mode: 0o600 });
      await chmod(keyPath, 0o600);
      await writeFile(certPath, made.cert, { mode: 0o600 });
      this.#log.info({ cert: certPath }, 'made the peer certificate');
    }
    // Read back what is on disk: the pin is of the certificate a restart will serve too.
    return { cert: await readFile(certPath, 'utf8'), key: await readFile(keyPath, 'utf8') };
  }

  /** Empties the staging directory (a restore killed with the daemon leaves its files) and
   * starts the server. */
  async start(): Promise<void> {
    const c = this.#o.config;
    await sweepStaging(c.stagingDir).catch((err: unknown) =>
      this.#log.warn({ dir: c.stagingDir, err: String(err) }, 'cannot empty the peer staging directory'),
    );
    if (!c.listen) return;
    this.#cert = await this.#loadCert();
    // A wildcard listen address is no address to dial: pushes stamp the node IP then.
    const wildcard = c.listen.host === '' || c.listen.host === '0.0.0.0' || c.listen.host === '::';
    const host = wildcard ? this.#o.nodeIP : c.listen.host;
    this.stamp = {
      address: `${isIPv6(host) ? `[${host}]` : host}:${c.listen.port}`,
      pin: certSha256(new X509Certificate(this.#cert.cert)),
    };
    if (!this.#o.clientCert)
      this.#log.warn(
        'the kubeconfig has no client certificate: other vk-cocoon hosts refuse this host as a peer client (wakes fall back to the registry); Go hosts over plain HTTP still answer',
      );
    const m = this.#o.metrics;
    this.#server = new PeerServer({
      listen: c.listen,
      tls: this.#cert,
      clientCa: this.#o.clientCa,
      storeDir: c.snapshotDir,
      resolve: (name, signal) => this.#resolve(name, signal),
      authorize: (who) => this.#authorize(who),
      allowPlainHttp: c.plainHttp.length > 0,
      maxStreams: c.maxStreams,
      bytesPerSecond: c.bandwidth,
      log: this.#log,
      metrics: {
        streamsInUse: (n) => m.serverStreams.set(n),
        bytesServed: (n) => m.serverBytes.inc(n),
        request: (route, result) => m.serverRequests.inc({ route, result }),
        refused: (reason) => m.serverRefusals.inc({ reason }),
      },
    });
    await this.#server.start();
    this.#log.info(
      { listen: `${c.listen.host || '*'}:${c.listen.port}`, plainHttpFrom: c.plainHttp, stamp: this.stamp },
      'peer server listening',
    );
  }

  async close(): Promise<void> {
    await this.#server?.close();
  }

  /** The provider's PeerRestorer: the state of `vmName` from the node `fromNode`, at its
   * stamped address (TLS, pinned) or, for a Go pusher, its Node's InternalIP (plain HTTP). */
  async restore(args: {
    vmName: string;
    fromNode: string;
    stamp?: { address: string; pin: string };
    config: SnapshotConfig;
    signal?: AbortSignal;
    log: Logger;
  }): Promise<{ dir: string; bytes: number; release(): Promise<void> } | { skip: string }> {
    const listen = this.#o.config.listen;
    if (!listen) return { skip: 'peer restore is disabled (VK_PEER_ADDR is empty)' };
    let baseUrl: string;
    if (args.stamp) baseUrl = `https://${args.stamp.address}`;
    else {
      const found = await this.#goPeer(args.fromNode, listen.port);
      if ('skip' in found) return found;
      baseUrl = found.url;
    }
    const m = this.#o.metrics;
    m.restoresActive.inc();
    try {
      const r = await this.#client.restore({
        baseUrl,
        pinSha256: args.stamp?.pin,
        clientCert: this.#o.clientCert,
        vmName: args.vmName,
        config: args.config,
        stagingRoot: this.#o.config.stagingDir,
        signal: args.signal ? AbortSignal.any([args.signal, this.#o.lifetime]) : this.#o.lifetime,
        log: args.log,
        limits: {
          maxTotalBytes: stagedBytesBound(args.config, this.#o.maxStagedBytes),
          bytesPerSecond: this.#o.config.bandwidth || undefined,
        },
        onBytes: (n) => m.restoreBytes.inc(n),
      });
      return { dir: r.dir, bytes: r.bytes, release: r.release };
    } finally {
      m.restoresActive.dec();
    }
  }

  /** A Go pusher's peer server, as Go finds it: its Node's first InternalIP at this host's port. */
  async #goPeer(name: string, port: number): Promise<{ url: string } | { skip: string }> {
    let node: V1Node;
    try {
      node = await this.#o.kube.core.readNode({ name });
    } catch (err) {
      return {
        skip:
          apiStatus(err) === 404
            ? `node ${name} does not exist`
            : `cannot read node ${name} (a Go pusher is found through its Node object): ${apiErrorMessage(err)}`,
      };
    }
    const ip = node.status?.addresses?.find((a) => a.type === 'InternalIP')?.address;
    if (!ip) return { skip: `node ${name} has no InternalIP` };
    return { url: `http://${isIPv6(ip) ? `[${ip}]` : ip}:${port}` };
  }

  /** A plan's name → snapshot id. Only a hibernated state this daemon saved is served: a ledger
   * entry named after its own VM (`<vmName>`, what a hibernate saves), confirmed, with the id
   * cocoon reports today. Clone sources, fork snapshots, a pod's own saves and anything made
   * by hand are answered as absent (Go serves every snapshot of the host). */
  async #resolve(name: string, signal: AbortSignal): Promise<{ id: string } | 'absent'> {
    const entry = this.#o.ledger.snapshot(name);
    if (entry?.state !== 'confirmed' || entry.owner.vmName !== name) {
      this.#log.debug(
        { snapshot: name, ledger: entry?.state ?? 'none' },
        'peer plan: not a hibernated state of ours',
      );
      return 'absent';
    }
    const rec = await inspectSnapshot(this.#o.cli, name, signal);
    // The very snapshot the ledger entry was written for: its id, or (a save reports none)
    // made after the save's intent, as every ledger check decides it.
    if (!rec || !entryOwns(entry, entry.owner, rec)) {
      this.#log.debug(
        { snapshot: name, id: rec?.id, ledgerId: entry.id },
        'peer plan: the snapshot is not the one saved',
      );
      return 'absent';
    }
    return { id: rec.id };
  }

  async #authorize(
    who: PeerCaller,
  ): Promise<{ ok: true; node: string } | { ok: false; status: 401 | 403; message: string }> {
    if (who.transport === 'tls') {
      const node = nodeFromCert(who);
      if (!node)
        return {
          ok: false,
          status: 401,
          message:
            'a node client certificate is required (CN system:node:<name>, O system:nodes, signed by the cluster CA)',
        };
      return { ok: true, node };
    }
    const ip = who.remoteAddress.replace(/^::ffff:/, '');
    if (!this.#plainFrom.check(ip, isIPv6(ip) ? 'ipv6' : 'ipv4'))
      return {
        ok: false,
        status: 403,
        message: 'plain HTTP is answered only from the networks of VK_PEER_PLAIN_HTTP',
      };
    return { ok: true, node: `plain:${ip}` };
  }
}
