// `kubectl logs -f` (docs/contracts/virtual-node.md "Logs"): `cocoon vm logs` cannot follow,
// so the console log's tail is polled every 2 s and what is new is written out, until the
// client disconnects. The polls run in a lane of their own (issue 18): FOLLOW_SLOTS at a time,
// shared fairly between namespaces (src/util/fair.ts), as streaming children outside the
// cocoon call pool. A hundred followers never take the slots that clones, inspects and
// deletes need, and one namespace's followers cannot starve another's.
import type { ChildProcess } from 'node:child_process';
import type { PassThrough } from 'node:stream';
import { logsArgv } from '../../cocoon/argv.ts';
import { pause } from '../../util/deadline.ts';
import { FairSlots } from '../../util/fair.ts';
import { rankNow } from '../../util/priority.ts';

/** Concurrent tail polls of all followers of the node. */
export const FOLLOW_SLOTS = 4;
export const FOLLOW_POLL_MS = 2000;
const POLL_TIMEOUT_MS = 30_000;

/** Lines of `next` (a newer tail of the same log) that come after the end of `previous`:
 * the last lines of `previous` are located in `next`, searching from the end. Without an
 * anchor (log rotated, or more new lines than the tail holds) all of `next` is new. */
export function newLogLines(previous: readonly string[], next: readonly string[]): string[] {
  const k = Math.min(previous.length, 20);
  if (k === 0) return [...next];
  const anchor = previous.slice(previous.length - k);
  for (let end = next.length - 1; end >= k - 1; end--) {
    let match = true;
    for (let i = 0; i < k; i++) {
      if (next[end - k + 1 + i] !== anchor[i]) {
        match = false;
        break;
      }
    }
    if (match) return next.slice(end + 1);
  }
  return [...next];
}

export interface Spawner {
  spawn(argv: readonly string[], opts: { signal?: AbortSignal }): ChildProcess;
}

export class LogFollower {
  readonly #cli: Spawner;
  readonly #lane: FairSlots;

  constructor(cli: Spawner, slots = FOLLOW_SLOTS) {
    this.#cli = cli;
    this.#lane = new FairSlots(slots);
  }

  /** Polls waiting for the lane (tests, metrics). */
  get waiting(): number {
    return this.#lane.waiting;
  }

  /** Writes the tail, then every new line, to `out` until `signal` aborts; then ends `out`. */
  follow(vmId: string, namespace: string, tailLines: number, out: PassThrough, signal: AbortSignal): void {
    void (async () => {
      let last: string[] = [];
      let first = true;
      while (!signal.aborted && !out.destroyed) {
        try {
          const stdout = await this.#tail(vmId, first ? tailLines : 1000, namespace, signal);
          const lines = stdout.split('\n').filter((l, i, a) => l !== '' || i < a.length - 1);
          const fresh = first ? lines : newLogLines(last, lines);
          if (fresh.length > 0) out.write(`${fresh.join('\n')}\n`);
          last = lines;
          first = false;
        } catch {
          if (signal.aborted) break;
        }
        await pause(FOLLOW_POLL_MS, signal);
      }
      out.end();
    })();
  }

  /** One `cocoon vm logs --tail N` in the lane; rejects on a failure or after 30 s. */
  async #tail(vmId: string, lines: number, namespace: string, signal: AbortSignal): Promise<string> {
    const release = await this.#lane.acquire(rankNow(), namespace, signal);
    try {
      const child = this.#cli.spawn(logsArgv(vmId, lines), {
        signal: AbortSignal.any([signal, AbortSignal.timeout(POLL_TIMEOUT_MS)]),
      });
      const chunks: Buffer[] = [];
      child.stdout?.on('data', (b: Buffer) => chunks.push(b));
      child.stderr?.resume();
      const code = await new Promise<number | null>((resolve) => {
        child.once('error', () => resolve(null));
        child.once('close', (c) => resolve(c));
      });
      if (code !== 0) throw new Error(`cocoon vm logs ${vmId} exited ${code}`);
      return Buffer.concat(chunks).toString();
    } finally {
      release();
    }
  }
}
