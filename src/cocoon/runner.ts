// Runs the `cocoon` CLI (cocoon-cli.md §1): argv arrays only (never a shell), every call
// with a deadline, the child's whole process group SIGKILLed on deadline, abort or
// provider shutdown. JSON verbs capture stdout and stderr apart; plain verbs capture the
// combined output. Error texts match the Go implementation's.
import { type ChildProcess, spawn } from 'node:child_process';
import type { Readable } from 'node:stream';
import type { Logger } from '../log.ts';
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

export interface CliCallOptions {
  timeoutMs: number;
  /** Caller-side abort (never a request signal for background work). */
  signal?: AbortSignal;
  stdin?: Buffer | Readable;
}

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

/** Bounds concurrent cocoon invocations: a burst of pods must not fork hundreds of
 * cocoon processes at once on a host that also runs the VMs. Streaming children (exec,
 * logs, events) are not counted: they live as long as their clients. */
class Semaphore {
  #free: number;
  #waiters: (() => void)[] = [];
  constructor(n: number) {
    this.#free = n;
  }
  async acquire(): Promise<() => void> {
    if (this.#free > 0) this.#free--;
    else await new Promise<void>((r) => this.#waiters.push(r));
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.#waiters.shift();
      if (next) next();
      else this.#free++;
    };
  }
}

export const MAX_CONCURRENT_CLI_CALLS = 24;

export class CocoonCli {
  readonly bin: string;
  readonly #slots = new Semaphore(MAX_CONCURRENT_CLI_CALLS);
  readonly #lifetime: AbortSignal;
  readonly #log: Logger;
  readonly #children = new Set<ChildProcess>();

  constructor(bin: string, lifetime: AbortSignal, log: Logger) {
    this.bin = bin;
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

  /** Runs a verb to completion; rejects with CocoonCommandError on any failure. */
  async run(argv: readonly string[], opts: CliCallOptions): Promise<CliResult> {
    const release = await this.#slots.acquire();
    try {
      return await this.#run(argv, opts);
    } finally {
      release();
    }
  }

  async #run(argv: readonly string[], opts: CliCallOptions): Promise<CliResult> {
    const json = isJsonVerb(argv);
    const started = performance.now();
    const deadline = AbortSignal.timeout(opts.timeoutMs);
    const signal = opts.signal ? AbortSignal.any([deadline, opts.signal]) : deadline;
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
      if (Buffer.isBuffer(opts.stdin)) child.stdin.end(opts.stdin);
      else opts.stdin.pipe(child.stdin);
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
    else if (opts.signal?.aborted) message = `cocoon ${argv.slice(0, 2).join(' ')}: aborted (${message})`;
    this.#log.debug({ argv, ms, err: message }, 'cocoon failed');
    throw new CocoonCommandError(argv, message, output, exit.code);
  }
}
