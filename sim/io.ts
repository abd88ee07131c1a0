// The per-invocation process surface of the simulator: stdout, stderr, stdin, environment,
// working directory, the invoking process's identity, signals and the end of the invocation.
//
// A verb never touches process.stdout/stdin/env/exit/pid directly: it goes through io() (or
// ctx.io), because the same code runs in two modes (docs/simulator.md, "Server mode"):
//  - process mode (sim/main.ts): one Node process per `cocoon` call; io() is the process itself;
//  - server mode (sim/server.ts): one long-lived Node process per root runs many calls at once;
//    each request has its own Io, found through AsyncLocalStorage.
// In server mode the caller may die at any moment (the thin client is SIGKILLed): the request
// is then *aborted*. A killed process runs no further code (no catch, no finally), so an
// aborted request must not either: every await that can outlive the caller goes through
// io.gate(), which never settles once the request is aborted, so the verb's async function is
// simply abandoned (and garbage-collected) at its next await point.
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Readable, Writable } from 'node:stream';
import { setTimeout as sleepAsync } from 'node:timers/promises';
import { selfStart } from './proc.ts';

export type SimSignal = 'SIGTERM' | 'SIGINT';

export interface Io {
  /** True when this invocation is a request of the simulator server. */
  readonly server: boolean;
  readonly stdout: Writable;
  readonly stderr: Writable;
  /** The caller's stdin (in server mode it is requested from the client on first read). */
  readonly stdin: Readable;
  readonly env: NodeJS.ProcessEnv;
  /** The caller's working directory (relative paths in argv resolve against it). */
  readonly cwd: string;
  /** The process that invoked `cocoon` (owner of placeholders and in-use markers). */
  readonly owner: { pid: number; start: number };
  /** Aborted when the caller is gone (never in process mode). */
  readonly signal: AbortSignal;
  /** Resolves or rejects like `p`, unless the invocation is aborted first: then never settles. */
  gate<T>(p: Promise<T>): Promise<T>;
  /** Sleeps `ms`; in server mode the timer is cancelled and the promise abandoned on abort. */
  sleep(ms: number): Promise<void>;
  /** Runs `fn` on SIGTERM/SIGINT of the caller instead of dying (event streams). */
  onSignal(sig: SimSignal, fn: () => void): void;
  /** Runs `fn` when the invocation ends, however it ends (server mode; process exit otherwise). */
  defer(fn: () => void): void;
  /** Ends the invocation with `code` (flushes stdout and stderr first). */
  exit(code: number): void;
}

const never = <T>(): Promise<T> => new Promise<T>(() => {});

const processIo: Io = {
  server: false,
  get stdout() {
    return process.stdout;
  },
  get stderr() {
    return process.stderr;
  },
  get stdin() {
    return process.stdin;
  },
  get env() {
    return process.env;
  },
  get cwd() {
    return process.cwd();
  },
  get owner() {
    return { pid: process.pid, start: selfStart() };
  },
  signal: new AbortController().signal,
  gate: (p) => p,
  sleep: (ms) => sleepAsync(ms),
  onSignal: (sig, fn) => {
    process.on(sig, fn);
  },
  defer: () => {},
  exit: (code) => process.exit(code),
};

/** Set by sim/server.ts: the server's counters, for `__sim server`. */
export const serverInfo: { stats?: () => Record<string, unknown> } = {};

const store = new AsyncLocalStorage<Io>();
let serverProcess = false;

/** Marks this process as the simulator server: io() outside a request is then a bug. */
export function markServerProcess(): void {
  serverProcess = true;
}

/** The current invocation's Io. */
export function io(): Io {
  const cur = store.getStore();
  if (cur) return cur;
  if (serverProcess) throw new Error('sim io() used outside a request');
  return processIo;
}

/** Runs `fn` as invocation `req` (server mode). */
export function runWithIo<T>(req: Io, fn: () => T): T {
  return store.run(req, fn);
}

/** Helpers for server-mode Io implementations. */
export function gateOn(signal: AbortSignal) {
  return <T>(p: Promise<T>): Promise<T> => {
    if (signal.aborted) return never<T>();
    return new Promise<T>((resolve, reject) => {
      p.then(
        (v) => {
          if (!signal.aborted) resolve(v);
        },
        (e) => {
          if (!signal.aborted) reject(e);
        },
      );
    });
  };
}

export function sleepOn(signal: AbortSignal) {
  const gate = gateOn(signal);
  return (ms: number): Promise<void> => gate(sleepAsync(ms, undefined, { signal }).catch(() => {}));
}

/** An await point: never returns once the invocation is aborted (a no-op in process mode). */
export function checkpoint(cur: Io = io()): Promise<void> {
  return cur.signal.aborted ? never<void>() : Promise.resolve();
}
