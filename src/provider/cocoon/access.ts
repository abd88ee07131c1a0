// Container access for the kubelet API (its ContainerAccess port): `kubectl logs` from the VM
// console log (polled for follow, since `cocoon vm logs` cannot follow) and `kubectl exec`
// through `cocoon vm exec`. Only the VM the pod holds is ever reached.
import { PassThrough, type Readable } from 'node:stream';
import { execArgv, logsArgv } from '../../cocoon/argv.ts';
import type { VmRecord } from '../../cocoon/records.ts';
import { killGroup } from '../../cocoon/runner.ts';
import { guestProfile } from '../../guest/profiles.ts';
import {
  type ContainerAccess,
  type ExecOutcome,
  type ExecStreams,
  type LogOptions,
  NotFoundError,
} from '../../kubelet/ports.ts';
import { pause } from '../../util/deadline.ts';
import type { ProviderContext } from './context.ts';
import type { PodRecord } from './state.ts';

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

export class VmAccess implements ContainerAccess {
  readonly #ctx: ProviderContext;

  constructor(ctx: ProviderContext) {
    this.#ctx = ctx;
  }

  #vmOf(namespace: string, pod: string): PodRecord & { vm: VmRecord } {
    const rec = this.#ctx.pods.get(`${namespace}/${pod}`);
    if (!rec?.vm) throw new NotFoundError(`pod ${namespace}/${pod} has no VM`);
    return rec as PodRecord & { vm: VmRecord };
  }

  async getContainerLogs(
    namespace: string,
    pod: string,
    _c: string,
    opts: LogOptions,
    signal: AbortSignal,
  ): Promise<Readable> {
    const rec = this.#ctx.pods.get(`${namespace}/${pod}`);
    const out = new PassThrough();
    if (!rec?.vm) {
      if (!rec) throw new NotFoundError(`pod ${namespace}/${pod} is not known to this node`);
      out.end(`vk-cocoon: pod ${namespace}/${pod} has no VM yet\n`);
      return out;
    }
    const logs = guestProfile(rec.spec?.os ?? 'linux').consoleLogs;
    if (logs.kind === 'none') {
      out.end(`${logs.line}\n`);
      return out;
    }
    const vmId = rec.vm.id;
    if (!opts.follow) {
      const child = this.#ctx.cli.spawn(logsArgv(vmId, opts.tailLines ?? 200), { signal });
      child.stdout?.pipe(out);
      child.stderr?.resume();
      return out;
    }
    // `cocoon vm logs` has no follow mode: poll the tail every 2 s and emit what is new,
    // until the client disconnects (the signal aborts) — docs/contracts/virtual-node.md "Logs".
    void (async () => {
      let last: string[] = [];
      let first = true;
      while (!signal.aborted && !out.destroyed) {
        try {
          const { stdout } = await this.#ctx.cli.run(logsArgv(vmId, first ? (opts.tailLines ?? 200) : 1000), {
            timeoutMs: 30_000,
            signal,
          });
          const lines = stdout.split('\n').filter((l, i, a) => l !== '' || i < a.length - 1);
          const fresh = first ? lines : newLogLines(last, lines);
          if (fresh.length > 0) out.write(`${fresh.join('\n')}\n`);
          last = lines;
          first = false;
        } catch {
          if (signal.aborted) break;
        }
        await pause(2000, signal);
      }
      out.end();
    })();
    return out;
  }

  async runInContainer(
    namespace: string,
    pod: string,
    _c: string,
    cmd: string[],
    streams: ExecStreams,
  ): Promise<ExecOutcome> {
    const rec = this.#vmOf(namespace, pod);
    const child = this.#ctx.cli.spawn(
      execArgv({ vmId: rec.vm.id, stdin: streams.stdin !== null, command: cmd }),
      {
        signal: streams.signal,
        stdin: streams.stdin !== null,
      },
    );
    if (streams.stdin && child.stdin) {
      child.stdin.on('error', () => {});
      streams.stdin.pipe(child.stdin);
    }
    if (streams.stdout) child.stdout?.pipe(streams.stdout, { end: false });
    else child.stdout?.resume();
    if (streams.stderr) child.stderr?.pipe(streams.stderr, { end: false });
    else child.stderr?.resume();
    const code = await new Promise<number | null>((resolve) => {
      child.once('error', () => resolve(null));
      child.once('close', (c) => resolve(c));
    });
    killGroup(child);
    if (code === 0) return { kind: 'success' };
    if (code === null)
      return {
        kind: 'error',
        message: `cocoon vm exec for ${rec.vm.name} did not start or was killed`,
      };
    return { kind: 'exit', code };
  }
}
