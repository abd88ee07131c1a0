// Node registration, the node Lease and node status (docs/contracts/virtual-node.md "Node object"–docs/contracts/virtual-node.md "Heartbeat and node status").
// - Lease kube-node-lease/<node> renewed every 10 s (40 s duration, owned by the Node).
// - Status patched every 60 s and on change, always carrying the full desired set of
//   provider-owned conditions (never adopting values read back from the server).
// - A health gate: while the runtime does not answer, neither Lease nor status is renewed,
//   so the node goes NotReady through the normal node lifecycle.
// - A deleted node is re-created (TS addition, logged).
import type { V1Lease, V1Node, V1NodeCondition } from '@kubernetes/client-node';
import { apiErrorMessage, apiStatus, type Kube, strategicMergePatch } from '../kube/client.ts';
import type { Informer } from '../kube/informer.ts';
import type { Logger } from '../log.ts';
import { delay } from '../util/deadline.ts';
import {
  desiredNode,
  desiredNodeStatus,
  labelsLeftToAdmin,
  type NodeFacts,
  nodeLabels,
  PROVIDER_TAINT_KEY,
} from './node-object.ts';
import type { NodeHealth } from './ports.ts';

const LEASE_NAMESPACE = 'kube-node-lease';
const LEASE_DURATION_SECONDS = 40;

export interface NodeAgentOptions {
  kube: Kube;
  facts: NodeFacts;
  health: NodeHealth;
  log: Logger;
  leaseIntervalMs?: number;
  statusIntervalMs?: number;
  healthIntervalMs?: number;
}

/** A Date whose JSON form has microsecond precision. The apiserver parses Lease
 * `renewTime` (a MicroTime) with exactly six fraction digits, while JSON.stringify of a Date
 * gives `toISOString()` (three digits) and gets a 400. */
export class MicroTime extends Date {
  override toISOString(): string {
    return super.toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
  }
  override toJSON(): string {
    return this.toISOString();
  }
}

export class NodeAgent {
  readonly #o: NodeAgentOptions;
  readonly #log: Logger;
  readonly #name: string;
  #uid: string | undefined;
  #lease: V1Lease | undefined;
  #conditions: V1NodeCondition[] | undefined;
  #healthy = true;
  #healthInFlight = false;
  #timers: NodeJS.Timeout[] = [];
  #stopped = false;
  #nodeWatch: Informer<V1Node> | undefined;
  #recreating: Promise<void> | undefined;
  readonly #abort = new AbortController();

  constructor(opts: NodeAgentOptions) {
    this.#o = opts;
    this.#name = opts.facts.config.nodeName;
    this.#log = opts.log.child({ module: 'node', node: this.#name });
  }

  get uid(): string | undefined {
    return this.#uid;
  }

  /** Creates the node or brings an existing one to the desired labels, taint and status. */
  async register(): Promise<void> {
    const { core } = this.#o.kube;
    const body = desiredNode(this.#o.facts, new Date());
    try {
      const created = await this.#o.kube.heartbeatWrite(() => core.createNode({ body }));
      this.#uid = created.metadata?.uid;
      this.#log.info({ uid: this.#uid }, 'node registered');
    } catch (err) {
      if (apiStatus(err) !== 409) throw err;
      const live = await core.readNode({ name: this.#name });
      this.#uid = live.metadata?.uid;
      await this.#assertMetadata(live);
      this.#log.info({ uid: this.#uid }, 'node exists; labels and taint re-asserted');
    }
    const leftToAdmin = labelsLeftToAdmin(this.#o.facts);
    if (leftToAdmin.length > 0)
      this.#log.info(
        { labels: leftToAdmin },
        'running as the node identity: NodeRestriction forbids a node these labels on itself; an administrator applies them',
      );
    await this.#patchStatus();
  }

  async #assertMetadata(live: V1Node): Promise<void> {
    const { core } = this.#o.kube;
    const labels = nodeLabels(this.#o.facts);
    const patch: Record<string, unknown> = { metadata: { labels } };
    const spec: Record<string, unknown> = {};
    const untainted = !(live.spec?.taints ?? []).some((t) => t.key === PROVIDER_TAINT_KEY);
    // NodeRestriction refuses any taint change a node makes to itself, which is also the point:
    // a node that could lift or add its own taints could steer workloads. The node is created
    // with the taint; if someone removed it since, that decision stands.
    if (untainted && this.#o.facts.nodeIdentity)
      this.#log.warn(
        { taint: PROVIDER_TAINT_KEY },
        'the node has no provider taint and a node identity may not add it; not re-added',
      );
    else if (untainted) {
      spec.taints = [
        ...(live.spec?.taints ?? []),
        { key: PROVIDER_TAINT_KEY, value: 'cocoon', effect: 'NoSchedule' },
      ];
    }
    if (this.#o.facts.config.providerID && !live.spec?.providerID)
      spec.providerID = this.#o.facts.config.providerID;
    if (Object.keys(spec).length > 0) patch.spec = spec;
    if (
      !this.#o.facts.config.snapshotCpuClass &&
      live.metadata?.labels?.['cocoonstack.io/snapshot-cpu-class'] !== undefined
    ) {
      (patch.metadata as { labels: Record<string, string | null> }).labels[
        'cocoonstack.io/snapshot-cpu-class'
      ] = null;
    }
    await this.#o.kube.heartbeatWrite(() =>
      core.patchNode({ name: this.#name, body: patch }, strategicMergePatch),
    );
  }

  start(): void {
    const leaseMs = this.#o.leaseIntervalMs ?? 10_000;
    const statusMs = this.#o.statusIntervalMs ?? 60_000;
    const healthMs = this.#o.healthIntervalMs ?? 10_000;
    void this.#renewLease();
    this.#every(leaseMs, () => this.#renewLease());
    this.#every(statusMs, () => this.#patchStatus());
    this.#every(healthMs, () => this.#checkHealth());
    // Labels and the daemon endpoint are re-asserted on the live node after registration,
    // because the node may have existed with stale labels (docs/contracts/virtual-node.md "Node object").
    void this.#reassertLater();
    this.#watchOwnNode();
  }

  /** Watches our own Node so a deletion is repaired at once, not at the next 60 s status
   * write (the 404 path of #patchStatus stays as the fallback). */
  #watchOwnNode(): void {
    const fieldSelector = `metadata.name=${this.#name}`;
    // The informer relists on 410 and re-opens the watch with backoff by itself; a relist
    // that no longer finds the node reports it deleted.
    const w = this.#o.kube.informer<V1Node>(
      '/api/v1/nodes',
      () => this.#o.kube.core.listNode({ fieldSelector }),
      { fieldSelector },
    );
    w.on('delete', () => void this.#recreate('node object was deleted'));
    w.on('error', (err: unknown) => {
      if (!this.#stopped)
        this.#log.warn({ err: apiErrorMessage(err) }, 'node watch failed; retrying with backoff');
    });
    this.#nodeWatch = w;
    void w.start().catch(() => {}); // rejects only when stopped first
  }

  #recreate(why: string): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    this.#recreating ??= (async () => {
      this.#log.warn({ why }, 're-creating the node object');
      try {
        this.#conditions = undefined;
        await this.register();
        this.#lease = undefined;
        await this.#renewLease();
      } catch (err) {
        this.#log.warn({ err: apiErrorMessage(err) }, 'node re-creation failed; the status loop retries');
      } finally {
        this.#recreating = undefined;
      }
    })();
    return this.#recreating;
  }

  #every(ms: number, fn: () => Promise<void>): void {
    const t = setInterval(() => {
      if (!this.#stopped)
        void fn().catch((err: unknown) => this.#log.warn({ err: apiErrorMessage(err) }, 'node loop error'));
    }, ms);
    t.unref();
    this.#timers.push(t);
  }

  async #reassertLater(): Promise<void> {
    await delay(5000);
    for (let attempt = 1; attempt <= 10 && !this.#stopped; attempt++) {
      try {
        const live = await this.#o.kube.core.readNode({ name: this.#name });
        await this.#assertMetadata(live);
        await this.#patchStatus();
        return;
      } catch (err) {
        this.#log.debug({ attempt, err: apiErrorMessage(err) }, 'label re-assert failed');
        await delay(2000);
      }
    }
  }

  async #checkHealth(): Promise<void> {
    if (this.#healthInFlight) return;
    this.#healthInFlight = true;
    const signal = AbortSignal.any([this.#abort.signal, AbortSignal.timeout(10_000)]);
    try {
      await this.#o.health.ping(signal);
      if (!this.#healthy) this.#log.info('runtime healthy again; resuming heartbeats');
      this.#healthy = true;
    } catch (err) {
      if (this.#healthy)
        this.#log.warn({ err: String(err) }, 'runtime health check failed; pausing heartbeats');
      this.#healthy = false;
    } finally {
      this.#healthInFlight = false;
    }
  }

  /** Patches node status with the full desired set; re-creates the node on 404. */
  async #patchStatus(): Promise<void> {
    if (!this.#healthy || this.#stopped) return;
    const { core } = this.#o.kube;
    for (let attempt = 1; attempt <= 5; attempt++) {
      const status = desiredNodeStatus(this.#o.facts, new Date(), this.#conditions);
      try {
        const res = await this.#o.kube.heartbeatWrite(() =>
          core.patchNodeStatus({ name: this.#name, body: { status } }, strategicMergePatch),
        );
        this.#conditions = status.conditions;
        this.#uid = res.metadata?.uid ?? this.#uid;
        return;
      } catch (err) {
        const code = apiStatus(err);
        if (code === 404) {
          await this.#recreate('node status write answered 404');
          return;
        }
        if (code === 409 && attempt < 5) {
          await delay(10);
          continue;
        }
        throw err;
      }
    }
  }

  #leaseBody(existing: V1Lease | undefined): V1Lease {
    const now = new MicroTime();
    return {
      apiVersion: 'coordination.k8s.io/v1',
      kind: 'Lease',
      metadata: {
        ...(existing?.metadata ?? {}),
        name: this.#name,
        namespace: LEASE_NAMESPACE,
        ownerReferences: this.#uid
          ? [{ apiVersion: 'v1', kind: 'Node', name: this.#name, uid: this.#uid }]
          : existing?.metadata?.ownerReferences,
      },
      spec: {
        ...(existing?.spec ?? {}),
        holderIdentity: this.#name,
        leaseDurationSeconds: LEASE_DURATION_SECONDS,
        renewTime: now,
      },
    };
  }

  /** Renews by PUT on the last known object; on failure GET (create on 404) with backoff
   * 200 ms doubling to 7 s, then PUT again, up to 5 attempts; a 409 re-reads. */
  async #renewLease(): Promise<void> {
    if (!this.#healthy || this.#stopped) return;
    const api = this.#o.kube.coordination;
    let backoff = 200;
    for (let attempt = 1; attempt <= 5 && !this.#stopped; attempt++) {
      try {
        if (this.#lease) {
          this.#lease = await this.#o.kube.heartbeatWrite(() =>
            api.replaceNamespacedLease({
              name: this.#name,
              namespace: LEASE_NAMESPACE,
              body: this.#leaseBody(this.#lease),
            }),
          );
          return;
        }
        try {
          this.#lease = await api.readNamespacedLease({ name: this.#name, namespace: LEASE_NAMESPACE });
        } catch (err) {
          if (apiStatus(err) !== 404) throw err;
          this.#lease = await this.#o.kube.heartbeatWrite(() =>
            api.createNamespacedLease({ namespace: LEASE_NAMESPACE, body: this.#leaseBody(undefined) }),
          );
          return;
        }
      } catch (err) {
        this.#lease = undefined;
        this.#log.debug({ attempt, err: apiErrorMessage(err) }, 'lease renew failed');
        if (apiStatus(err) !== 409) {
          await delay(backoff);
          backoff = Math.min(backoff * 2, 7000);
        }
      }
    }
  }

  stop(): void {
    this.#stopped = true;
    void this.#nodeWatch?.stop();
    this.#abort.abort();
    for (const t of this.#timers) clearInterval(t);
  }
}
