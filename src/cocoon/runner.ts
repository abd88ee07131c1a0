// Runs the `cocoon` CLI (docs/contracts/cocoon-cli.md "Invocation"): argv arrays only (never a shell), every call
// with a deadline, the child's whole process group SIGKILLed on deadline, abort or
// provider shutdown. JSON verbs capture stdout and stderr apart; plain verbs capture the
// combined output. Error texts match the Go implementation's.
import { AsyncLocalStorage } from 'node:async_hooks';
import { type ChildProcess, spawn } from 'node:child_process';
import type { Readable, Writable } from 'node:stream';
import type { Logger } from '../log.ts';
import { timeoutSignal } from '../util/deadline.ts';
import { currentTenant, FairSlots } from '../util/fair.ts';
import { currentOpSignal } from '../util/op-signal.ts';
import { rankNow } from '../util/priority.ts';
import {
  type CocoonErrorClass,
  classifyCocoonError,
  formatJsonVerbError,
  formatPlainVerbError,
  isJsonVerb,
} from './errors.ts';

export class CocoonCommandError extends Error {
  override name = 'CocoonCommandError';
  readonly argv: readonly string[];
  readonly output: string;
  readonly errorClass: CocoonErrorClass;
  readonly exitCode: number | null;

  constructor(argv: readonly string[], message: string, output: string, exitCode: number | null) {
    super(message);
    this.argv = argv;
    this.output = output;
    this.exitCode = exitCode;
    this.errorClass = classifyCocoonError(message);
  }
}

/** How long a call of a pod's bring-up or delete waits for a free slot, apart from its own
 * deadline (`queueTimeoutMs`; docs/decisions.md "Bounded waiting"): a burst of hundreds of pods
 * queues behind the slots for minutes, which is the node being busy, not the call failing. */
export const POD_OP_QUEUE_MS = 10 * 60_000;
/** The call options of a pod's bring-up or delete calls: {@link POD_OP_QUEUE_MS} for the wait. */
export const POD_OP_QUEUE = { queueTimeoutMs: POD_OP_QUEUE_MS } as const;

export interface CliCallOptions {
  /** Deadline of the whole call, counted from the call: time queued for a slot included
   * (unless `queueTimeoutMs` is set). */
  timeoutMs: number;
  /** When set, the wait for a slot has this bound of its own and `timeoutMs` counts from the
   * grant: for a pod's bring-up or delete ({@link POD_OP_QUEUE_MS}), whose place in a busy
   * node's queue is not a fault of the call (docs/decisions.md "Bounded waiting"). A bring-up's
   * wait still ends at once when its pod is deleted (the op signal). */
  queueTimeoutMs?: number;
  /** Caller-side abort (never a request signal for background work); also ends a wait for a slot. */
  signal?: AbortSignal;
  /** The child's stdin: bytes, a stream piped in, or a writer given the stdin stream itself (it
   * writes, ends it, and learns from each write's callback when the child's pipe took the bytes;
   * a rejection destroys stdin). */
  stdin?: Buffer | Readable | StdinWriter;
  /** `high` calls get a free slot before waiting `normal` ones (default `normal`): calls of
   * pods further along (inspect of a cloned VM, fixup exec) over new clones. Within a level
   * the pod's admission sequence (src/util/priority.ts, from the async context) orders them. */
  priority?: CliPriority;
}

/** Writes a child's stdin (see {@link CliCallOptions.stdin}). */
export type StdinWriter = (stdin: Writable) => Promise<void>;

export interface CocoonCliOptions {
  /** Concurrent non-streaming calls (default MAX_CONCURRENT_CLI_CALLS). */
  maxConcurrent?: number;
  /** Concurrent transfers (default DEFAULT_TRANSFER_SLOTS; VK_TRANSFER_SLOTS). */
  transferSlots?: number;
}

/** Verbs that move a snapshot or an image (minutes, not seconds): they take a transfer slot,
 * never one of the short calls' slots (issue 18: 64 slow pulls must not hold the slots the
 * clones and inspects of other pods need). */
export function isTransferVerb(argv: readonly string[]): boolean {
  const verb = `${argv[0] ?? ''} ${argv[1] ?? ''}`;
  return (
    verb === 'snapshot import' ||
    verb === 'snapshot export' ||
    verb === 'image import' ||
    verb === 'image pull'
  );
}

/** Set while a transfer holds its slot (CocoonCli.transfer): its own transfer verbs run on it. */
const inTransfer = new AsyncLocalStorage<boolean>();

export interface CliResult {
  stdout: string;
  stderr: string;
}

/** Kills the child's process group (it runs detached in its own group). */
export function killGroup(child: ChildProcess): void {
  if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return;
  try {
    process.kill(-child.pid, 'SIGKILL');
  } catch {
    try {
      child.kill('SIGKILL');
    } catch {
      // already gone
    }
  }
}

export type CliPriority = 'high' | 'normal';

/** Bounds concurrent cocoon invocations: a burst of pods must not fork hundreds of
 * cocoon processes at once on a host that also runs the VMs. Streaming children (exec,
 * logs, events) are not counted: they live as long as their clients. Waiters leave the
 * queue the moment their signal fires (deadline, abort, shutdown). The slots are shared
 * fairly between namespaces (src/util/fair.ts: calls without a namespace first, then the
 * waiting namespaces in turn, none holding more than its cap); within a namespace, or among
 * calls without one, waiters are served by rank (src/util/priority.ts): `high` first, then
 * calls without a priority context, then by the pod's admission sequence (oldest pod first),
 * FIFO among equals; so under a burst the pods further along finish before new clones start. */
export class Semaphore {
  readonly #slots: FairSlots;
  constructor(n: number) {
    this.#slots = new FairSlots(n);
  }

  /** Calls waiting for a slot. */
  get waiting(): number {
    return this.#slots.waiting;
  }

  /** Resolves with the release function once a slot is free; rejects with the signal's
   * reason if it fires first (the waiter is removed at once). The rank and the tenant are
   * taken from `priority` and the caller's async context at the call. */
  acquire(signal?: AbortSignal, priority: CliPriority = 'normal'): Promise<() => void> {
    return this.#slots.acquire(rankNow(priority === 'high'), currentTenant(), signal);
  }
}

export const MAX_CONCURRENT_CLI_CALLS = 24;
export const DEFAULT_TRANSFER_SLOTS = 8;

export class CocoonCli {
  readonly bin: string;
  readonly #slots: Semaphore;
  readonly #transfers: Semaphore;
  readonly #lifetime: AbortSignal;
  readonly #log: Logger;
  readonly #children = new Set<ChildProcess>();

  constructor(bin: string, lifetime: AbortSignal, log: Logger, opts: CocoonCliOptions = {}) {
    this.bin = bin;
    this.#slots = new Semaphore(opts.maxConcurrent ?? MAX_CONCURRENT_CLI_CALLS);
    this.#transfers = new Semaphore(opts.transferSlots ?? DEFAULT_TRANSFER_SLOTS);
    this.#lifetime = lifetime;
    this.#log = log.child({ module: 'cocoon-cli' });
    lifetime.addEventListener('abort', () => {
      for (const c of this.#children) killGroup(c);
    });
  }

  /** Starts a streaming child (exec, logs, events); the caller owns its stdio. */
  spawn(argv: readonly string[], opts: { signal?: AbortSignal; stdin?: boolean } = {}): ChildProcess {
    const child = spawn(this.bin, [...argv], {
      stdio: [opts.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
      detached: true,
      env: process.env,
    });
    this.#children.add(child);
    const signals = [this.#lifetime, ...(opts.signal ? [opts.signal] : [])];
    const onAbort = () => killGroup(child);
    for (const s of signals) {
      if (s.aborted) onAbort();
      else s.addEventListener('abort', onAbort, { once: true });
    }
    child.once('close', () => {
      this.#children.delete(child);
      for (const s of signals) s.removeEventListener('abort', onAbort);
    });
    return child;
  }

  /** Calls waiting for a free slot. */
  get waiting(): number {
    return this.#slots.waiting;
  }

  /** Transfers waiting for a transfer slot. */
  get transfersWaiting(): number {
    return this.#transfers.waiting;
  }

  /** Runs a whole transfer (a registry pull or push: downloads, uploads and the cocoon
   * import or export they feed) holding one transfer slot, so the transfers of the node are
   * bounded as a whole, not only their cocoon calls. Its own transfer verbs take no second
   * slot; its short calls (inspect, rm) take call slots as usual. */
  async transfer<T>(fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    if (inTransfer.getStore()) return await fn();
    const release = await this.#transfers.acquire(
      AbortSignal.any([this.#lifetime, ...(signal ? [signal] : [])]),
    );
    try {
      return await inTransfer.run(true, fn);
    } finally {
      release();
    }
  }

  /** Runs a verb to completion; rejects with CocoonCommandError on any failure. The
   * deadline counts from this call, including the wait for a slot (from the grant, with
   * `queueTimeoutMs`, which then bounds the wait); a deadline, abort or shutdown while
   * waiting rejects at once without starting the child. */
  async run(argv: readonly string[], opts: CliCallOptions): Promise<CliResult> {
    const started = performance.now();
    // Whole milliseconds, at least 1. On a plain setTimeout (timeoutSignal, as
    // AbortSignal.timeout), so tests with mock timers can expire it.
    const ms = (n: number) => Math.max(1, Math.ceil(n));
    const queueBound = opts.queueTimeoutMs;
    let waitBound: AbortSignal;
    let waitTimer: ReturnType<typeof setTimeout> | undefined;
    if (queueBound === undefined) waitBound = timeoutSignal(ms(opts.timeoutMs));
    else {
      // A wait bound of its own is cleared at the grant (a bring-up's is minutes long).
      const ac = new AbortController();
      waitTimer = setTimeout(() => ac.abort(), ms(queueBound));
      waitTimer.unref?.();
      waitBound = ac.signal;
    }
    // The operation's signal (a bring-up DeletePod aborts, src/util/op-signal.ts) ends the
    // call too, whether it waits for a slot or runs.
    const op = currentOpSignal();
    const ends = [this.#lifetime, ...(opts.signal ? [opts.signal] : []), ...(op ? [op] : [])];
    let release: () => void;
    try {
      const pool = isTransferVerb(argv) ? (inTransfer.getStore() ? undefined : this.#transfers) : this.#slots;
      release = pool ? await pool.acquire(AbortSignal.any([waitBound, ...ends]), opts.priority) : () => {};
    } catch {
      const verb = `cocoon ${argv.slice(0, 2).join(' ')}`;
      const waited = Math.round(performance.now() - started);
      const why = waitBound.aborted
        ? queueBound !== undefined
          ? `no free slot within ${queueBound} ms`
          : `deadline of ${opts.timeoutMs} ms exceeded`
        : this.#lifetime.aborted
          ? 'provider shutting down'
          : 'aborted';
      const message = `${verb}: ${why} (waited ${waited} ms for a free slot)`;
      this.#log.debug({ argv, ms: waited, err: message }, 'cocoon call not started');
      throw new CocoonCommandError(argv, message, '', null);
    } finally {
      clearTimeout(waitTimer);
    }
    const deadline = queueBound !== undefined ? timeoutSignal(ms(opts.timeoutMs)) : waitBound;
    try {
      return await this.#run(argv, opts, deadline, AbortSignal.any([deadline, ...ends]), started);
    } finally {
      release();
    }
  }

  async #run(
    argv: readonly string[],
    opts: CliCallOptions,
    deadline: AbortSignal,
    signal: AbortSignal,
    started: number,
  ): Promise<CliResult> {
    const json = isJsonVerb(argv);
    const child = this.spawn(argv, { signal, stdin: opts.stdin !== undefined });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    const combined: Buffer[] = [];
    child.stdout?.on('data', (b: Buffer) => {
      out.push(b);
      combined.push(b);
    });
    child.stderr?.on('data', (b: Buffer) => {
      err.push(b);
      combined.push(b);
    });
    if (opts.stdin !== undefined && child.stdin) {
      child.stdin.on('error', () => {}); // EPIPE when the child exits early; its exit status tells
      const stdin = child.stdin;
      if (Buffer.isBuffer(opts.stdin)) stdin.end(opts.stdin);
      else if (typeof opts.stdin === 'function')
        opts.stdin(stdin).catch((error: Error) => stdin.destroy(error));
      else opts.stdin.pipe(stdin);
    }
    const exit = await new Promise<{
      code: number | null;
      signal: NodeJS.Signals | null;
      spawnError?: Error;
    }>((resolve) => {
      child.once('error', (e) => resolve({ code: null, signal: null, spawnError: e }));
      child.once('close', (code, sig) => resolve({ code, signal: sig }));
    });
    const stdout = Buffer.concat(out).toString();
    const stderr = Buffer.concat(err).toString();
    const ms = Math.round(performance.now() - started);
    if (exit.spawnError) {
      throw new CocoonCommandError(argv, `${this.bin}: ${exit.spawnError.message}`, '', null);
    }
    if (exit.code === 0) {
      this.#log.trace({ argv, ms }, 'cocoon ok');
      return { stdout, stderr };
    }
    const output = json ? stderr : Buffer.concat(combined).toString();
    let message = json ? formatJsonVerbError(exit, stderr) : formatPlainVerbError(exit, output);
    if (deadline.aborted)
      message = `cocoon ${argv.slice(0, 2).join(' ')}: deadline of ${opts.timeoutMs} ms exceeded (${message})`;
    else if (this.#lifetime.aborted)
      message = `cocoon ${argv.slice(0, 2).join(' ')}: provider shutting down (${message})`;
    else if (opts.signal?.aborted || signal.aborted)
      message = `cocoon ${argv.slice(0, 2).join(' ')}: aborted (${message})`;
    this.#log.debug({ argv, ms, err: message }, 'cocoon failed');
    throw new CocoonCommandError(argv, message, output, exit.code);
  }
}
