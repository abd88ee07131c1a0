// ICMP echo for the readiness probe of pods without a probe port (docs/decisions.md, "ICMP
// probes"). Node.js has no raw or ICMP socket, and unprivileged ping sockets are off on many
// hosts (`net.ipv4.ping_group_range = 1 0`), so the echo is sent by Debian's `fping` (package
// fping, installed with CAP_NET_RAW as a file capability; the daemon's unit keeps CAP_NET_RAW
// in its bounding set). Spawning one `ping` per probe costs about 4 ms of CPU (a fork of the
// daemon plus the child), 0.8 of a core for 1,000 ready pods probed every 5 s; fping takes
// every address of a batch in one process, about 0.25 ms per probe (`npm run bench:icmp`).
//
// A probe waits at most its `withinMs` for others to share its fping run: BATCH_WINDOW_MS by
// default (a pod coming up), READY_WINDOW_MS for the 5 s probes of ready pods, which fall at
// random phases: 1,000 ready pods make 200 probes a second, about 2 per 10 ms but 200 per
// second, and a run costs about 5 ms of CPU whatever its size up to a few hundred. A batch
// runs when its earliest deadline comes or it holds MAX_BATCH addresses (MAX_RUNS runs at
// once; further batches wait). fping prints `<ip> is alive` as each reply arrives and `<ip> is
// unreachable` when its timeout passes, so an answering guest is known within its round trip,
// whatever else is in the batch.
import { spawn as nodeSpawn } from 'node:child_process';
import { isIPv4 } from 'node:net';
import type { Logger } from '../log.ts';

export const BATCH_WINDOW_MS = 10;
export const READY_WINDOW_MS = 1000;
export const MAX_BATCH = 256;
export const MAX_RUNS = 4;
/** The binary, looked up on PATH (the unit's default PATH has /usr/bin). */
export const FPING = 'fping';

/** One fping output line: the address and whether it answered; `undefined` for anything else. */
export function parseFpingLine(line: string): { ip: string; alive: boolean } | undefined {
  const m = /^(\S+) is (alive|unreachable)\b/.exec(line.trim());
  if (!m?.[1] || !isIPv4(m[1])) return undefined;
  return { ip: m[1], alive: m[2] === 'alive' };
}

/** fping's argv for one batch: IPv4, one echo per address (no retry), `timeoutMs` to answer,
 * 1 ms between sends. Addresses are validated IPv4 literals, so none can read as an option. */
export function fpingArgs(ips: readonly string[], timeoutMs: number): string[] {
  return ['-4', '-r', '0', '-t', String(Math.max(1, Math.round(timeoutMs))), '-i', '1', ...ips];
}

interface SpawnedChild {
  stdout: NodeJS.ReadableStream | null;
  stderr: NodeJS.ReadableStream | null;
  once(event: 'error', fn: (err: Error) => void): unknown;
  once(event: 'close', fn: (code: number | null) => void): unknown;
  kill(signal?: NodeJS.Signals): boolean;
}
export type Spawner = (cmd: string, args: readonly string[]) => SpawnedChild;

const defaultSpawn: Spawner = (cmd, args) => nodeSpawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });

export interface IcmpProberOptions {
  timeoutMs: number;
  log: Logger;
  bin?: string;
  spawn?: Spawner;
}

/** Batched ICMP echo through fping. `probe` never rejects: a run that fails answers false. */
export class IcmpProber {
  readonly #o: Required<Omit<IcmpProberOptions, 'log'>> & { log: Logger };
  #pending = new Map<string, ((alive: boolean) => void)[]>();
  #timer: NodeJS.Timeout | undefined;
  /** When the pending batch runs (performance.now() ms). */
  #flushAt = Number.POSITIVE_INFINITY;
  #queued: Map<string, ((alive: boolean) => void)[]>[] = [];
  #running = 0;
  #failureLoggedAt = Number.NEGATIVE_INFINITY;

  constructor(opts: IcmpProberOptions) {
    this.#o = { bin: FPING, spawn: defaultSpawn, ...opts };
  }

  /** True when `ip` answered one echo within the timeout; the echo goes out within `withinMs`. */
  probe(ip: string, withinMs = BATCH_WINDOW_MS): Promise<boolean> {
    if (!isIPv4(ip)) return Promise.resolve(false);
    return new Promise((resolve) => {
      const waiters = this.#pending.get(ip);
      if (waiters) waiters.push(resolve);
      else this.#pending.set(ip, [resolve]);
      if (this.#pending.size >= MAX_BATCH) {
        this.#flush();
        return;
      }
      const at = performance.now() + withinMs;
      if (at >= this.#flushAt) return;
      // Not unref'd: a probe waiting for its batch is work in flight.
      clearTimeout(this.#timer);
      this.#flushAt = at;
      this.#timer = setTimeout(() => this.#flush(), withinMs);
    });
  }

  #flush(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#flushAt = Number.POSITIVE_INFINITY;
    if (this.#pending.size === 0) return;
    this.#queued.push(this.#pending);
    this.#pending = new Map();
    this.#drain();
  }

  #drain(): void {
    while (this.#running < MAX_RUNS) {
      const batch = this.#queued.shift();
      if (!batch) return;
      this.#running++;
      this.#run(batch).finally(() => {
        this.#running--;
        this.#drain();
      });
    }
  }

  #run(batch: Map<string, ((alive: boolean) => void)[]>): Promise<void> {
    const settle = (ip: string, alive: boolean) => {
      for (const r of batch.get(ip) ?? []) r(alive);
      batch.delete(ip);
    };
    return new Promise((done) => {
      let child: SpawnedChild;
      try {
        child = this.#o.spawn(this.#o.bin, fpingArgs([...batch.keys()], this.#o.timeoutMs));
      } catch (err) {
        this.#runFailed(String(err));
        for (const ip of [...batch.keys()]) settle(ip, false);
        done();
        return;
      }
      let rest = '';
      let stderr = '';
      child.stdout?.setEncoding('utf8');
      child.stdout?.on('data', (chunk: string) => {
        const lines = (rest + chunk).split('\n');
        rest = lines.pop() ?? '';
        for (const line of lines) {
          const r = parseFpingLine(line);
          if (r) settle(r.ip, r.alive);
        }
      });
      child.stderr?.setEncoding('utf8');
      child.stderr?.on('data', (chunk: string) => {
        if (stderr.length < 4096) stderr += chunk;
      });
      // A run cannot outlive its timeout by much: fping exits after the last address's timeout.
      const guard = setTimeout(() => child.kill('SIGKILL'), this.#o.timeoutMs + 5000);
      guard.unref();
      const finish = (code: number | null, err?: Error) => {
        clearTimeout(guard);
        const r = parseFpingLine(rest);
        if (r) settle(r.ip, r.alive);
        // Exit 0: all alive; 1: some unreachable; 2: an address unknown. 3 and 4 (bad
        // arguments, a failed system call) and a spawn error are failures of the mechanism.
        if (err || code === null || code >= 3)
          this.#runFailed(err ? String(err) : `exit ${code}: ${stderr.trim()}`);
        for (const ip of [...batch.keys()]) settle(ip, false);
        done();
      };
      child.once('error', (err) => finish(null, err));
      child.once('close', (code) => finish(code));
    });
  }

  #runFailed(why: string): void {
    // At most once a minute: a host that lost fping would otherwise log every batch.
    const now = performance.now();
    if (now - this.#failureLoggedAt < 60_000) return;
    this.#failureLoggedAt = now;
    this.#o.log.warn({ err: why }, 'fping run failed: its probes count as not answered');
  }
}

/**
 * Whether this host can send ICMP echo through fping: one echo to 127.0.0.1, which always
 * answers and never leaves the machine. Returns the reason when it cannot.
 */
export async function icmpUnavailable(
  opts: Omit<IcmpProberOptions, 'timeoutMs'>,
): Promise<string | undefined> {
  const spawn = opts.spawn ?? defaultSpawn;
  return await new Promise((resolve) => {
    let child: SpawnedChild;
    try {
      child = spawn(opts.bin ?? FPING, fpingArgs(['127.0.0.1'], 1000));
    } catch (err) {
      resolve(String(err));
      return;
    }
    let out = '';
    child.stdout?.setEncoding('utf8');
    child.stdout?.on('data', (c: string) => {
      out += c;
    });
    child.stderr?.setEncoding('utf8');
    child.stderr?.on('data', (c: string) => {
      out += c;
    });
    child.once('error', (err) => resolve(`${opts.bin ?? FPING}: ${err.message}`));
    child.once('close', (code) => {
      const alive = out.split('\n').some((l) => parseFpingLine(l)?.alive === true);
      resolve(
        code === 0 && alive ? undefined : `${opts.bin ?? FPING} exited ${code}: ${out.trim() || 'no output'}`,
      );
    });
  });
}
