// Container access for the kubelet API (its ContainerAccess port): `kubectl logs` from the VM
// console log (polled for follow in a lane of its own, log-follow.ts) and `kubectl exec`
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
import type { ProviderContext } from './context.ts';
import { LogFollower } from './log-follow.ts';
import type { PodRecord } from './state.ts';

export class VmAccess implements ContainerAccess {
  readonly #ctx: ProviderContext;
  readonly #follower: LogFollower;

  constructor(ctx: ProviderContext) {
    this.#ctx = ctx;
    this.#follower = new LogFollower(ctx.cli);
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
    // `cocoon vm logs` has no follow mode: polled in a lane of its own (log-follow.ts).
    this.#follower.follow(vmId, namespace, opts.tailLines ?? 200, out, signal);
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
