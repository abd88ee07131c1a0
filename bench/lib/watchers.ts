// Observers of a bench run: the namespace's pods (a watch for precise times, re-established when
// the apiserver ends it, plus a slow relist that catches what a re-established watch missed)
// and the simulator's lease file (fs.watch on its directory plus a 20 ms poll).
import { existsSync, type FSWatcher, watch as fsWatch, mkdirSync, readFileSync, statSync } from 'node:fs';
import { basename, dirname } from 'node:path';
import { type CoreV1Api, type KubeConfig, type V1Pod, Watch } from '@kubernetes/client-node';

const LIFECYCLE = 'vm.cocoonstack.io/lifecycle-state';
const LIFECYCLE_MESSAGE = 'vm.cocoonstack.io/lifecycle-state-message';
const VM_ID = 'vm.cocoonstack.io/id';

export interface PodView {
  name: string;
  /** When the create request was answered (epoch ms; set by the creator). */
  createdAt?: number;
  /** When the watch (or a list) first showed the pod. */
  firstSeenAt?: number;
  lifecycle: string;
  message: string;
  /** status.phase and status.reason (`Failed`, `OutOfcpu`: rejected by admission). */
  phase: string;
  reason: string;
  podReady: boolean;
  vmId: string;
  resourceVersion: string;
  /** First time lifecycle-state=ready was seen. */
  readyAt?: number;
  /** First time the Ready condition was seen True. */
  podReadyAt?: number;
  /** Last time a new resourceVersion was seen. */
  modifiedAt?: number;
  deleted: boolean;
}

/** True when the pod has lifecycle-state=ready and the Ready condition True. */
export function settledReady(v: PodView): boolean {
  return v.lifecycle === 'ready' && v.podReady;
}

export class PodTracker {
  readonly pods = new Map<string, PodView>();
  readonly #core: CoreV1Api;
  readonly #kc: KubeConfig;
  readonly #ns: string;
  #watching = false;
  #req: AbortController | undefined;
  #relist: NodeJS.Timeout | undefined;
  /** Watch restarts (the apiserver ends watches after a while, or on errors). */
  restarts = 0;

  constructor(kc: KubeConfig, core: CoreV1Api, ns: string) {
    this.#kc = kc;
    this.#core = core;
    this.#ns = ns;
  }

  view(name: string): PodView {
    let v = this.pods.get(name);
    if (!v) {
      v = {
        name,
        lifecycle: '',
        message: '',
        phase: '',
        reason: '',
        podReady: false,
        vmId: '',
        resourceVersion: '',
        deleted: false,
      };
      this.pods.set(name, v);
    }
    return v;
  }

  observe(p: V1Pod, deleted = false, now = Date.now()): void {
    const name = p.metadata?.name;
    if (!name) return;
    const v = this.view(name);
    v.firstSeenAt ??= now;
    if (deleted) v.deleted = true;
    const rv = p.metadata?.resourceVersion ?? '';
    // A relist may carry an older version than the watch already delivered: keep the newest.
    if (rv && v.resourceVersion && Number(rv) < Number(v.resourceVersion)) return;
    if (rv && rv !== v.resourceVersion) {
      if (v.resourceVersion) v.modifiedAt = now;
      v.resourceVersion = rv;
    }
    const ann = p.metadata?.annotations ?? {};
    v.lifecycle = ann[LIFECYCLE] ?? '';
    v.message = ann[LIFECYCLE_MESSAGE] ?? '';
    v.vmId = ann[VM_ID] ?? '';
    v.phase = p.status?.phase ?? '';
    v.reason = p.status?.reason ?? '';
    v.podReady = p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
    if (v.lifecycle === 'ready') v.readyAt ??= now;
    if (v.podReady) v.podReadyAt ??= now;
  }

  async start(relistMs = 10_000): Promise<void> {
    this.#watching = true;
    await this.#startWatch();
    this.#relist = setInterval(() => void this.relist().catch(() => {}), relistMs);
  }

  async #startWatch(): Promise<void> {
    const w = new Watch(this.#kc);
    this.#req = await w.watch(
      `/api/v1/namespaces/${this.#ns}/pods`,
      {},
      (type: string, p: V1Pod) => this.observe(p, type === 'DELETED'),
      () => {
        if (!this.#watching) return;
        this.restarts++;
        this.#rewatch(100);
      },
    );
  }

  /** Re-establishes the watch after `delayMs`, retrying every second while it fails. */
  #rewatch(delayMs: number): void {
    setTimeout(() => {
      if (this.#watching) void this.#startWatch().catch(() => this.#rewatch(1000));
    }, delayMs);
  }

  async relist(): Promise<void> {
    const list = await this.#core.listNamespacedPod({ namespace: this.#ns });
    for (const p of list.items) this.observe(p);
  }

  stop(): void {
    this.#watching = false;
    if (this.#relist) clearInterval(this.#relist);
    this.#req?.abort();
  }

  count(pred: (v: PodView) => boolean): number {
    let n = 0;
    for (const v of this.pods.values()) if (pred(v)) n++;
    return n;
  }
}

/** First-seen time of every MAC in the simulator's lease file. */
export class LeaseWatcher {
  readonly firstSeen = new Map<string, number>();
  readonly #path: string;
  #watcher: FSWatcher | undefined;
  #poll: NodeJS.Timeout | undefined;
  #stamp = '';

  constructor(path: string) {
    this.#path = path;
    // The directory may not exist before the first lease; watching needs it.
    mkdirSync(dirname(path), { recursive: true });
    const name = basename(path);
    try {
      this.#watcher = fsWatch(dirname(path), (_event, file) => {
        // The simulator writes a temporary file and renames it over the lease file.
        if (file === null || file === name || file.startsWith(name)) this.read();
      });
      this.#watcher.on('error', () => {});
    } catch {
      // no inotify: the poll alone
    }
    this.#poll = setInterval(() => this.read(), 20);
    this.read();
  }

  read(): void {
    const now = Date.now();
    if (!existsSync(this.#path)) return;
    let stamp: string;
    try {
      const st = statSync(this.#path);
      stamp = `${st.ino}:${st.size}:${st.mtimeMs}`;
    } catch {
      return;
    }
    if (stamp === this.#stamp) return;
    try {
      const rows = JSON.parse(readFileSync(this.#path, 'utf8')) as { mac: string }[] | null;
      for (const r of rows ?? []) if (r?.mac && !this.firstSeen.has(r.mac)) this.firstSeen.set(r.mac, now);
      this.#stamp = stamp;
    } catch {
      // mid-write; the next event or tick reads it again
    }
  }

  stop(): void {
    this.#watcher?.close();
    if (this.#poll) clearInterval(this.#poll);
  }
}
