// Fair shares of a bounded pool between tenants (issue 18, docs/decisions.md "Fair call
// pools"): the node's cocoon call slots and transfer slots are shared by every namespace, and
// one namespace's slow calls (pulls, run-mode URLs, silent guests) must not take them all.
//
// - Calls made on behalf of a pod carry its namespace as the tenant, implicitly, through the
//   async context (like the admission priority of src/util/priority.ts): the provider runs
//   every per-pod operation under `runAsTenant(namespace, …)`.
// - Calls without a tenant (startup, the health check's `vm list`, the event stream's
//   re-check, node and kubelet API work: a small, bounded stream) are served first.
// - Waiting tenants are served round-robin, one grant each in turn; within a tenant, by rank
//   (src/util/priority.ts: `high` first, then admission order, then arrival).
// - No tenant holds more than `cap` slots (the size less a quarter, at least one slot kept
//   back; all of a pool of one): slots cannot be taken back from a call that holds one, so
//   without this reserve a namespace whose 64 calls each hold a slot for 30 minutes would
//   make the next namespace wait for the first of them to end. With it, another namespace
//   always finds a slot at once.
import { AsyncLocalStorage } from 'node:async_hooks';
import { type Rank, RankedList } from './priority.ts';

const tenants = new AsyncLocalStorage<string | undefined>();

/** Runs `fn` with `tenant` as the current tenant (`undefined`: no tenant). */
export function runAsTenant<T>(tenant: string | undefined, fn: () => T): T {
  return tenants.run(tenant, fn);
}

/** The tenant of the current async context; `undefined` outside any `runAsTenant`. */
export function currentTenant(): string | undefined {
  return tenants.getStore();
}

/** The most slots one tenant may hold in a pool of `size`. */
export function tenantCap(size: number): number {
  if (size <= 1) return 1;
  return size - Math.max(1, Math.floor(size / 4));
}

interface Waiter {
  readonly rank: Rank;
  readonly tenant: string | undefined;
  readonly grant: () => void;
}

/** A counting semaphore with tenants (see the header). Waiters leave at once when their
 * signal fires. */
export class FairSlots {
  readonly size: number;
  readonly cap: number;
  #free: number;
  readonly #held = new Map<string, number>();
  readonly #system = new RankedList<Waiter>();
  readonly #queues = new Map<string, RankedList<Waiter>>();
  /** Tenants with waiters, in turn order; `#cursor` is the next one to serve. */
  #ring: string[] = [];
  #cursor = 0;
  #waiting = 0;

  constructor(size: number, opts: { cap?: number } = {}) {
    if (!Number.isInteger(size) || size < 1)
      throw new RangeError(`pool size must be a positive integer, got ${size}`);
    this.size = size;
    this.cap = Math.min(size, Math.max(1, opts.cap ?? tenantCap(size)));
    this.#free = size;
  }

  /** Calls waiting for a slot. */
  get waiting(): number {
    return this.#waiting;
  }

  /** Slots held by a tenant. */
  heldBy(tenant: string): number {
    return this.#held.get(tenant) ?? 0;
  }

  /** Resolves with the release function once a slot is granted; rejects with the signal's
   * reason if it fires first. `rank` orders waiters within a tenant. */
  async acquire(rank: Rank, tenant: string | undefined, signal?: AbortSignal): Promise<() => void> {
    if (signal?.aborted) throw signal.reason;
    if (this.#free > 0 && this.#eligible(tenant)) this.#take(tenant);
    else {
      await new Promise<void>((resolve, reject) => {
        const waiter: Waiter = {
          rank,
          tenant,
          grant: () => {
            signal?.removeEventListener('abort', onAbort);
            resolve();
          },
        };
        const onAbort = () => {
          this.#remove(waiter);
          reject(signal?.reason);
        };
        signal?.addEventListener('abort', onAbort, { once: true });
        this.#insert(waiter);
      });
    }
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#free++;
      if (tenant !== undefined) {
        const n = this.heldBy(tenant) - 1;
        if (n > 0) this.#held.set(tenant, n);
        else this.#held.delete(tenant);
      }
      this.#dispatch();
    };
  }

  #eligible(tenant: string | undefined): boolean {
    return tenant === undefined || this.heldBy(tenant) < this.cap;
  }

  #take(tenant: string | undefined): void {
    this.#free--;
    if (tenant !== undefined) this.#held.set(tenant, this.heldBy(tenant) + 1);
  }

  #insert(w: Waiter): void {
    this.#waiting++;
    if (w.tenant === undefined) {
      this.#system.insert(w);
      return;
    }
    let q = this.#queues.get(w.tenant);
    if (!q) {
      q = new RankedList<Waiter>();
      this.#queues.set(w.tenant, q);
      // A tenant that starts waiting takes its turn after those already waiting.
      this.#ring.splice(this.#cursor, 0, w.tenant);
      this.#cursor = (this.#cursor + 1) % this.#ring.length;
    }
    q.insert(w);
  }

  #remove(w: Waiter): void {
    const list = w.tenant === undefined ? this.#system : this.#queues.get(w.tenant);
    if (!list?.remove(w)) return;
    this.#waiting--;
    if (w.tenant !== undefined && list.length === 0) this.#dropTenant(w.tenant);
  }

  #dropTenant(tenant: string): void {
    this.#queues.delete(tenant);
    const i = this.#ring.indexOf(tenant);
    if (i < 0) return;
    this.#ring.splice(i, 1);
    if (i < this.#cursor) this.#cursor--;
    if (this.#cursor >= this.#ring.length) this.#cursor = 0;
  }

  /** The next waiter to serve: untenanted first, then the next tenant in turn that is under
   * its cap. */
  #next(): Waiter | undefined {
    const sys = this.#system.shift();
    if (sys) return sys;
    for (let step = 0; step < this.#ring.length; step++) {
      const i = (this.#cursor + step) % this.#ring.length;
      const tenant = this.#ring[i] as string;
      if (this.heldBy(tenant) >= this.cap) continue;
      const q = this.#queues.get(tenant) as RankedList<Waiter>;
      const w = q.shift() as Waiter;
      if (q.length === 0) {
        this.#queues.delete(tenant);
        this.#ring.splice(i, 1);
        this.#cursor = this.#ring.length === 0 ? 0 : i % this.#ring.length;
      } else this.#cursor = (i + 1) % this.#ring.length;
      return w;
    }
    return undefined;
  }

  #dispatch(): void {
    while (this.#free > 0) {
      const w = this.#next();
      if (!w) return;
      this.#waiting--;
      this.#take(w.tenant);
      w.grant();
    }
  }
}
