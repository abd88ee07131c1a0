// The VM event stream (docs/contracts/cocoon-cli.md, "Event line"; docs/contracts/pod-to-vm.md,
// "VM event watcher and eviction"): `cocoon vm status --event --format json` for the process lifetime,
// one JSON `{event, vm}` per line. Lines over 1 MiB and undecodable lines are skipped; a
// stream that fails to start or dies is restarted with backoff (1 s doubling to 60 s, reset
// after a good start); a stream that ends normally is reconnected after 2 s. Every (re)start
// is reported, so the caller can re-check what it may have missed while no stream ran.
//
// Hand-written line splitting (not node:readline): readline cannot bound a line's length, and
// a runaway line must not grow the daemon's memory.
import type { ChildProcess } from 'node:child_process';
import type { Logger } from '../log.ts';
import { pause } from '../util/deadline.ts';
import { statusEventsArgv } from './argv.ts';
import { decodeVmRecord, type VmRecord } from './records.ts';
import type { CocoonCli } from './runner.ts';

export type VmEventKind = 'ADDED' | 'MODIFIED' | 'DELETED';

export interface VmEvent {
  readonly event: VmEventKind;
  readonly vm: VmRecord;
}

export const MAX_EVENT_LINE_BYTES = 1024 * 1024;
const BACKOFF_BASE_MS = 1000;
const BACKOFF_MAX_MS = 60_000;
const RECONNECT_MS = 2000;
/** A stream that ran this long (or delivered a line) was a good start: the backoff resets. */
const GOOD_START_MS = 10_000;

/** Decodes one line; `undefined` for anything that is not a well-formed event. */
export function parseEventLine(line: string): VmEvent | undefined {
  let raw: unknown;
  try {
    raw = JSON.parse(line);
  } catch {
    return undefined;
  }
  if (typeof raw !== 'object' || raw === null) return undefined;
  const { event, vm } = raw as { event?: unknown; vm?: unknown };
  if (event !== 'ADDED' && event !== 'MODIFIED' && event !== 'DELETED') return undefined;
  const decoded = decodeVmRecord(vm);
  return decoded.ok ? { event, vm: decoded.value } : undefined;
}

/** Splits a byte stream into lines of at most `max` bytes; longer lines are dropped whole. */
export class LineSplitter {
  readonly #max: number;
  #parts: Buffer[] = [];
  #size = 0;
  #dropping = false;

  constructor(max = MAX_EVENT_LINE_BYTES) {
    this.#max = max;
  }

  /** Feeds a chunk; returns the complete lines it finished (and how many were dropped). */
  push(chunk: Buffer): { lines: string[]; dropped: number } {
    const lines: string[] = [];
    let dropped = 0;
    let start = 0;
    for (;;) {
      const nl = chunk.indexOf(0x0a, start);
      const end = nl < 0 ? chunk.length : nl;
      const piece = chunk.subarray(start, end);
      if (!this.#dropping) {
        if (this.#size + piece.length > this.#max) {
          this.#dropping = true;
          this.#parts = [];
          this.#size = 0;
        } else if (piece.length > 0) {
          this.#parts.push(piece);
          this.#size += piece.length;
        }
      }
      if (nl < 0) break;
      if (this.#dropping) dropped++;
      else lines.push(Buffer.concat(this.#parts).toString('utf8'));
      this.#parts = [];
      this.#size = 0;
      this.#dropping = false;
      start = nl + 1;
    }
    return { lines, dropped };
  }
}

export interface VmEventStreamOptions {
  readonly cli: CocoonCli;
  readonly log: Logger;
  readonly lifetime: AbortSignal;
  readonly onEvent: (ev: VmEvent) => void;
  /** Each time a stream starts (the first included): events may have been missed before. */
  readonly onStart?: (restart: boolean) => void;
  /** A stream ended normally (before the reconnect). */
  readonly onEnd?: () => void;
}

/** Runs the stream until the lifetime ends. */
export class VmEventStream {
  readonly #o: VmEventStreamOptions;
  #child: ChildProcess | undefined;
  #starts = 0;

  constructor(opts: VmEventStreamOptions) {
    this.#o = opts;
  }

  /** The running stream's process (tests kill it to see it restarted). */
  get pid(): number | undefined {
    return this.#child?.pid;
  }

  get starts(): number {
    return this.#starts;
  }

  start(): void {
    void this.#loop().catch((err: unknown) =>
      this.#o.log.error({ err: String(err) }, 'VM event stream loop ended'),
    );
  }

  async #loop(): Promise<void> {
    const { lifetime, log } = this.#o;
    let backoff = BACKOFF_BASE_MS;
    while (!lifetime.aborted) {
      const started = performance.now();
      const outcome = await this.#runOnce();
      if (lifetime.aborted) return;
      const good = outcome.lines > 0 || performance.now() - started >= GOOD_START_MS;
      if (good) backoff = BACKOFF_BASE_MS;
      if (outcome.normal) {
        this.#o.onEnd?.();
        log.info('VM event stream ended; reconnecting');
        await pause(RECONNECT_MS, lifetime);
      } else {
        log.warn({ err: outcome.error, retryInMs: backoff }, 'VM event stream failed; restarting');
        await pause(backoff, lifetime);
        backoff = Math.min(BACKOFF_MAX_MS, backoff * 2);
      }
    }
  }

  #runOnce(): Promise<{ normal: boolean; lines: number; error?: string }> {
    return new Promise((resolve) => {
      let child: ChildProcess;
      try {
        child = this.#o.cli.spawn(statusEventsArgv(), {});
      } catch (err) {
        resolve({ normal: false, lines: 0, error: String(err) });
        return;
      }
      this.#child = child;
      this.#o.onStart?.(this.#starts++ > 0);
      const splitter = new LineSplitter();
      let lines = 0;
      let stderr = '';
      child.stdout?.on('data', (chunk: Buffer) => {
        const out = splitter.push(chunk);
        if (out.dropped > 0) this.#o.log.warn({ dropped: out.dropped }, 'VM event lines over 1 MiB skipped');
        for (const line of out.lines) {
          if (line.trim() === '') continue;
          lines++;
          const ev = parseEventLine(line);
          if (ev) this.#o.onEvent(ev);
          else this.#o.log.debug({ line: line.slice(0, 200) }, 'undecodable VM event line skipped');
        }
      });
      child.stderr?.on('data', (b: Buffer) => {
        if (stderr.length < 4096) stderr += b.toString('utf8');
      });
      let settled = false;
      const done = (r: { normal: boolean; lines: number; error?: string }) => {
        if (settled) return;
        settled = true;
        this.#child = undefined;
        resolve(r);
      };
      child.once('error', (err) => done({ normal: false, lines, error: err.message }));
      child.once('close', (code, signal) => {
        if (code === 0) done({ normal: true, lines });
        else done({ normal: false, lines, error: `exit ${code ?? signal}: ${stderr.trim().slice(0, 500)}` });
      });
    });
  }
}
