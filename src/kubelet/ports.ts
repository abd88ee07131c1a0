// The port the kubelet API owns: what a provider implements to serve `kubectl logs` and
// `kubectl exec` (after virtual-kubelet's ContainerLogs/RunInContainer). Nothing here
// imports a provider; providers import this.
import type { Readable } from 'node:stream';
import type { ExecOutcome, ExecStreams } from './streams/exec-session.ts';

export { InvalidInputError, NotFoundError } from '../pods/ports.ts';
export type { ExecOutcome, ExecStreams };

export interface LogOptions {
  tailLines?: number;
  limitBytes?: number;
  follow: boolean;
  timestamps: boolean;
  previous: boolean;
  sinceSeconds?: number;
  sinceTime?: Date;
}

export interface ContainerAccess {
  getContainerLogs(
    namespace: string,
    pod: string,
    container: string,
    opts: LogOptions,
    signal: AbortSignal,
  ): Promise<Readable>;
  runInContainer(
    namespace: string,
    pod: string,
    container: string,
    cmd: string[],
    streams: ExecStreams,
  ): Promise<ExecOutcome>;
}
