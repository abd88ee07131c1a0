// The minimal provider of the virtual-node milestone: enough to prove the node end to end.
// CreatePod clones the VM named by `vm.cocoonstack.io/name` from the local snapshot its
// `cocoonset.cocoonstack.io/image` names; DeletePod removes it; logs and exec go to the VM
// through `cocoon vm logs` / `cocoon vm exec`. The full lifecycle provider replaces it.
import { PassThrough, type Readable } from 'node:stream';
import type { V1Pod, V1PodStatus } from '@kubernetes/client-node';
import { cloneArgv, execArgv, listArgv, logsArgv, removeArgv } from '../cocoon/argv.ts';
import { parseVmRecord, type VmRecord } from '../cocoon/records.ts';
import { CocoonCommandError, type CocoonCli, killGroup } from '../cocoon/runner.ts';
import type { ExecOutcome, ExecStreams } from '../kubelet/streams/exec-session.ts';
import { IMAGE, VM_ID, VM_NAME } from '../lifecycle/annotations.ts';
import type { Logger } from '../log.ts';
import { KeyedQueue } from '../util/keyed-queue.ts';
import { localSnapshotName } from '../vmspec/snapshot-name.ts';
import { type LogOptions, NotFoundError, type Provider } from './types.ts';

interface Tracked {
  pod: V1Pod;
  vm: VmRecord | undefined;
  startTime: Date;
}

const key = (ns: string, name: string) => `${ns}/${name}`;

export class MinimalProvider implements Provider {
  readonly #cli: CocoonCli;
  readonly #log: Logger;
  readonly #nodeIP: string;
  readonly #pods = new Map<string, Tracked>();
  readonly #queue = new KeyedQueue();
  #notify: (pod: V1Pod) => void = () => {};

  constructor(cli: CocoonCli, nodeIP: string, log: Logger) {
    this.#cli = cli;
    this.#nodeIP = nodeIP;
    this.#log = log.child({ module: 'provider' });
  }

  notifyPods(cb: (pod: V1Pod) => void): void {
    this.#notify = cb;
  }

  async ping(signal: AbortSignal): Promise<void> {
    await this.#cli.run(listArgv(), { timeoutMs: 10_000, signal });
  }

  createPod(pod: V1Pod): Promise<void> {
    const k = key(pod.metadata?.namespace ?? '', pod.metadata?.name ?? '');
    return this.#queue.run(k, async () => {
      const existing = this.#pods.get(k);
      if (existing?.vm && existing.pod.metadata?.uid === pod.metadata?.uid) {
        this.#publish(existing);
        return;
      }
      const ann = pod.metadata?.annotations ?? {};
      const vmName = ann[VM_NAME];
      const image = ann[IMAGE];
      if (!vmName) throw new Error(`pod has no ${VM_NAME} annotation`);
      if (!image) throw new Error(`pod has no ${IMAGE} annotation`);
      const log = this.#log.child({ pod: k, vm: vmName });
      const argv = cloneArgv({ vmName, backend: 'cloud-hypervisor', source: { snapshot: localSnapshotName(image) } });
      const { stdout } = await this.#cli.run(argv, { timeoutMs: 10 * 60_000 });
      const rec = parseVmRecord(stdout);
      if (!rec.ok) throw new Error(`cocoon vm clone printed an unreadable record: ${rec.error}`);
      const tracked: Tracked = {
        pod: { ...pod, metadata: { ...pod.metadata, annotations: { ...ann, [VM_ID]: rec.value.id } } },
        vm: rec.value,
        startTime: new Date(),
      };
      this.#pods.set(k, tracked);
      log.info({ vmId: rec.value.id }, 'VM cloned');
      this.#publish(tracked);
    });
  }

  updatePod(pod: V1Pod): Promise<void> {
    const k = key(pod.metadata?.namespace ?? '', pod.metadata?.name ?? '');
    return this.#queue.run(k, async () => {
      const t = this.#pods.get(k);
      if (!t || t.pod.metadata?.uid !== pod.metadata?.uid) return;
      t.pod = { ...pod, metadata: { ...pod.metadata, annotations: { ...pod.metadata?.annotations, ...this.#owned(t) } } };
    });
  }

  #owned(t: Tracked): Record<string, string> {
    return t.vm ? { [VM_ID]: t.vm.id } : {};
  }

  deletePod(pod: V1Pod): Promise<void> {
    const k = key(pod.metadata?.namespace ?? '', pod.metadata?.name ?? '');
    return this.#queue.run(k, async () => {
      const t = this.#pods.get(k);
      if (!t) throw new NotFoundError(`pod ${k} is not known to the provider`);
      if (t.pod.metadata?.uid !== pod.metadata?.uid) return; // superseded incarnation
      if (t.vm) {
        try {
          await this.#cli.run(removeArgv(t.vm.id), { timeoutMs: 60_000 });
        } catch (err) {
          if (!(err instanceof CocoonCommandError && err.errorClass === 'vm_not_found')) throw err;
        }
      }
      this.#pods.delete(k);
      this.#log.info({ pod: k, vm: t.vm?.name }, 'VM removed');
    });
  }

  getPod(namespace: string, name: string): V1Pod | undefined {
    return this.#pods.get(key(namespace, name))?.pod;
  }

  getPodStatus(namespace: string, name: string): V1PodStatus | undefined {
    const t = this.#pods.get(key(namespace, name));
    return t ? this.#status(t) : undefined;
  }

  getPods(): V1Pod[] {
    return [...this.#pods.values()].map((t) => ({ ...t.pod, status: this.#status(t) }));
  }

  #status(t: Tracked): V1PodStatus {
    const running = t.vm !== undefined;
    const cond = (type: string, ok: boolean) => ({ type, status: ok ? 'True' : 'False', lastTransitionTime: t.startTime });
    return {
      phase: running ? 'Running' : 'Pending',
      hostIP: this.#nodeIP,
      hostIPs: [{ ip: this.#nodeIP }],
      startTime: t.startTime,
      conditions: [cond('PodScheduled', true), cond('Initialized', true), cond('Ready', running), cond('ContainersReady', running)],
      containerStatuses: (t.pod.spec?.containers ?? []).map((c) => ({
        name: c.name,
        image: c.image ?? '',
        imageID: '',
        ready: running,
        restartCount: 0,
        started: running,
        state: running ? { running: { startedAt: t.startTime } } : { waiting: { reason: 'Creating' } },
      })),
    };
  }

  #publish(t: Tracked): void {
    this.#notify({ ...t.pod, status: this.#status(t) });
  }

  #vmOf(namespace: string, pod: string): VmRecord {
    const t = this.#pods.get(key(namespace, pod));
    if (!t?.vm) throw new NotFoundError(`pod ${namespace}/${pod} has no VM`);
    return t.vm;
  }

  async getContainerLogs(namespace: string, pod: string, _c: string, opts: LogOptions, signal: AbortSignal): Promise<Readable> {
    const vm = this.#vmOf(namespace, pod);
    const child = this.#cli.spawn(logsArgv(vm.id, opts.tailLines ?? 200), { signal });
    const out = new PassThrough();
    child.stdout?.pipe(out);
    child.stderr?.resume();
    return out;
  }

  async runInContainer(namespace: string, pod: string, _c: string, cmd: string[], streams: ExecStreams): Promise<ExecOutcome> {
    const vm = this.#vmOf(namespace, pod);
    const child = this.#cli.spawn(execArgv({ vmId: vm.id, stdin: streams.stdin !== null, command: cmd }), {
      signal: streams.signal,
      stdin: streams.stdin !== null,
    });
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
    if (code === null) return { kind: 'error', message: 'cocoon vm exec failed to start' };
    return { kind: 'exit', code };
  }
}
