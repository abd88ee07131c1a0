// A fake `cocoon` runner for in-process tests of the provider: an in-memory VM and snapshot
// table answering the verbs the provider calls with the CLI's JSON shapes and error texts
// (docs/cocoon-cli contract as the simulator implements it), every call recorded, and any
// verb overridable (`on(/^vm clone /, handler)`) to inject failures, hangs or latency.
//
//   const cocoon = new FakeCocoon();
//   cocoon.snapshot('acme/agent', { image: 'ghcr.io/acme/agent:1' });
//   cocoon.on(/^snapshot inspect /, () => new Promise(() => {}));   // hangs
//   const provider = new CocoonProvider({ ..., cli: cocoon.cli });
import type { ChildProcess } from 'node:child_process';
import {
  type CliCallOptions,
  type CliResult,
  type CocoonCli,
  CocoonCommandError,
} from '../../../src/cocoon/runner.ts';
import { currentOpSignal } from '../../../src/util/op-signal.ts';

export interface FakeVm {
  id: string;
  name: string;
  hypervisor: string;
  state: string;
  pid: number;
  image: string;
  nics: { mac: string; network?: { ip: string; gateway: string; prefix: number } | null }[];
  /** `config.cpu` / `config.memory` (printed only when set). */
  cpu?: number;
  memory?: number;
  /** RFC 3339 (`created_at`); a VM made by hand before a test's pod is older than its intent. */
  createdAt: string;
}

export interface FakeSnapshot {
  name: string;
  image: string;
  hypervisor: string;
  /** Static addressing of NIC 0 of its clones (a fixup is owed), if any. */
  staticIp?: string;
  /** Saved vCPUs and memory bytes (printed only when set; its clones get them). */
  cpu?: number;
  memory?: number;
}

export interface FakeCliCall {
  argv: string[];
  at: number;
}

export type FakeCliHandler = (argv: string[], opts: CliCallOptions) => Promise<CliResult> | CliResult;

const B32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';

export class FakeCocoon {
  readonly vms = new Map<string, FakeVm>();
  readonly snapshots = new Map<string, FakeSnapshot>();
  readonly calls: FakeCliCall[] = [];
  readonly #handlers: [RegExp, FakeCliHandler][] = [];
  #seq = 0;

  /** The object the provider takes as its `cli`. */
  readonly cli: CocoonCli = {
    bin: '/fake/cocoon',
    // As the real runner: the operation's abort signal (src/util/op-signal.ts) ends the call.
    run: (argv: readonly string[], opts: CliCallOptions) => {
      const op = currentOpSignal();
      const signal = op && opts.signal ? AbortSignal.any([opts.signal, op]) : (op ?? opts.signal);
      if (signal?.aborted) return Promise.reject(new CocoonCommandError([...argv], 'aborted', '', null));
      return this.#run([...argv], { ...opts, signal });
    },
    spawn: () => {
      throw new Error('FakeCocoon: spawn is not supported');
    },
  } as unknown as CocoonCli;

  /** Overrides the answer of calls whose argv (joined with spaces) matches `re`. */
  on(re: RegExp, handler: FakeCliHandler): this {
    this.#handlers.unshift([re, handler]);
    return this;
  }

  snapshot(name: string, opts: Partial<FakeSnapshot> = {}): void {
    this.snapshots.set(name, { name, image: '', hypervisor: 'cloud-hypervisor', ...opts });
  }

  /** Adds a running VM (as if cloned by hand); returns it. */
  addVm(name: string, opts: Partial<FakeVm> = {}): FakeVm {
    const n = ++this.#seq;
    let id = '';
    for (let i = 0; i < 26; i++) id += B32[(n * 7 + i * 13) % 32];
    id = `${B32[n % 32]}${id.slice(1)}`;
    const vm: FakeVm = {
      id,
      name,
      hypervisor: 'cloud-hypervisor',
      state: 'running',
      pid: 1000 + n,
      image: '',
      nics: [{ mac: `02:00:00:00:00:${n.toString(16).padStart(2, '0')}` }],
      createdAt: new Date().toISOString(),
      ...opts,
    };
    this.vms.set(vm.id, vm);
    return vm;
  }

  callsOf(prefix: string): FakeCliCall[] {
    return this.calls.filter((c) => c.argv.join(' ').startsWith(prefix));
  }

  #find(ref: string): FakeVm | undefined {
    return this.vms.get(ref) ?? [...this.vms.values()].find((v) => v.name === ref);
  }

  static json(vm: FakeVm): string {
    return JSON.stringify({
      id: vm.id,
      hypervisor: vm.hypervisor,
      state: vm.state,
      pid: vm.pid,
      config: {
        name: vm.name,
        image: vm.image,
        image_type: 'oci',
        ...(vm.cpu !== undefined ? { cpu: vm.cpu } : {}),
        ...(vm.memory !== undefined ? { memory: vm.memory } : {}),
      },
      network_configs: vm.nics.map((n) => ({
        mac: n.mac,
        tap: 'tap0',
        netns_path: '',
        network: n.network ?? null,
      })),
      storage_configs: [],
      vsock_socket: '',
      created_at: vm.createdAt,
    });
  }

  #fail(argv: string[], message: string): never {
    throw new CocoonCommandError(argv, `cocoon ${argv.join(' ')}: ${message}`, message, 1);
  }

  async #run(argv: string[], opts: CliCallOptions): Promise<CliResult> {
    this.calls.push({ argv, at: performance.now() });
    const line = argv.join(' ');
    for (const [re, handler] of this.#handlers) if (re.test(line)) return await handler(argv, opts);
    const [group, verb] = argv;
    const last = argv.at(-1) ?? '';
    if (group === 'vm' && verb === 'list') {
      return {
        stdout:
          this.vms.size === 0
            ? 'No VMs found.\n'
            : JSON.stringify([...this.vms.values()].map((v) => JSON.parse(FakeCocoon.json(v)))),
        stderr: '',
      };
    }
    if (group === 'vm' && verb === 'inspect') {
      const vm = this.#find(last);
      if (!vm) this.#fail(argv, `vm not found: ${last}`);
      return { stdout: FakeCocoon.json(vm), stderr: '' };
    }
    if (group === 'snapshot' && verb === 'inspect') {
      const s = this.snapshots.get(last);
      if (!s) this.#fail(argv, `snapshot not found: ${last}`);
      return {
        stdout: JSON.stringify({
          id: `snap-${s.name}`,
          name: s.name,
          image: s.image,
          image_digest: '',
          image_type: '',
          image_blob_ids: {},
          hypervisor: s.hypervisor,
          ...(s.cpu !== undefined ? { cpu: s.cpu } : {}),
          ...(s.memory !== undefined ? { memory: s.memory } : {}),
        }),
        stderr: '',
      };
    }
    if (group === 'vm' && verb === 'clone') {
      const name = argv[argv.indexOf('--name') + 1] ?? '';
      if (this.#find(name)) this.#fail(argv, `vm name "${name}" already exists`);
      const fromDir = argv.includes('--from-dir');
      if (!fromDir && !this.snapshots.has(last)) this.#fail(argv, `snapshot not found: ${last}`);
      const snap = this.snapshots.get(last);
      const vm = this.addVm(name, {
        hypervisor: snap?.hypervisor ?? 'cloud-hypervisor',
        ...(snap?.cpu !== undefined ? { cpu: snap.cpu } : {}),
        ...(snap?.memory !== undefined ? { memory: snap.memory } : {}),
      });
      if (snap?.staticIp) vm.nics[0]!.network = { ip: snap.staticIp, gateway: '10.0.0.1', prefix: 24 };
      return { stdout: FakeCocoon.json(vm), stderr: '' };
    }
    if (group === 'vm' && verb === 'rm') {
      if (!this.vms.delete(last)) this.#fail(argv, `vm not found: ${last}`);
      return { stdout: '', stderr: '' };
    }
    if (group === 'snapshot' && verb === 'rm') {
      if (!this.snapshots.delete(last)) this.#fail(argv, `snapshot not found: ${last}`);
      return { stdout: '', stderr: '' };
    }
    if (group === 'snapshot' && verb === 'save') {
      const name = argv[argv.indexOf('--name') + 1] ?? '';
      const vm = this.#find(last);
      if (!vm) this.#fail(argv, `vm not found: ${last}`);
      if (this.snapshots.has(name)) this.#fail(argv, `snapshot name "${name}" already exists`);
      this.snapshot(name, { image: vm.image, hypervisor: vm.hypervisor });
      return { stdout: `snap-${name}\n`, stderr: '' };
    }
    if (group === 'snapshot' && verb === 'list') {
      return {
        stdout: JSON.stringify(
          [...this.snapshots.values()].map((s) => ({
            id: `snap-${s.name}`,
            name: s.name,
            image: s.image,
            hypervisor: s.hypervisor,
          })),
        ),
        stderr: '',
      };
    }
    if (group === 'vm' && verb === 'start') {
      const vm = this.#find(last);
      if (!vm) this.#fail(argv, `vm not found: ${last}`);
      vm.state = 'running';
      return { stdout: '', stderr: '' };
    }
    if (group === 'vm' && verb === 'net') {
      const vm = this.#find(last);
      if (!vm) this.#fail(argv, `vm not found: ${last}`);
      const n = Number(argv[argv.indexOf('--nics') + 1]);
      vm.nics = Array.from({ length: n }, (_, i) => vm.nics[i] ?? { mac: `02:00:00:00:ff:${i}${this.#seq}` });
      return { stdout: '', stderr: '' };
    }
    if (group === 'vm' && verb === 'exec') return { stdout: '', stderr: '' };
    if (group === 'image') return { stdout: '{}', stderr: '' };
    this.#fail(argv, `FakeCocoon: unsupported verb ${line}`);
  }
}

/** A call that never answers until its abort signal fires (then fails as killed). */
export function hangUntilAborted(argv: string[], opts: CliCallOptions): Promise<CliResult> {
  return new Promise((_resolve, reject) => {
    opts.signal?.addEventListener('abort', () => reject(new CocoonCommandError(argv, 'killed', '', null)), {
      once: true,
    });
  });
}

export type { ChildProcess };
