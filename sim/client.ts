// Typed helpers for tests and benchmarks that use the cocoon simulator (docs/simulator.md).
//
//   const sim = await newSimRoot({ knobs: { dhcp: { leaseDelayMs: 500 } } });
//   await sim.fixtureSnapshot('acme/agent', { backend: 'cloud-hypervisor', os: 'linux', image: 'ghcr.io/acme/agent:1' });
//   const bin = await sim.installBin();          // VK_COCOON_BIN for the provider
//   spawn(provider, { env: { ...process.env, ...sim.env(), VK_COCOON_BIN: bin } });
//   ... sim.calls(), sim.guestCommands(), sim.leases() ...
//   await sim.cleanup();                          // kills every stand-in, stops the server, removes the root
//
// newSimRoot starts the root's simulator server (sim/server.ts) when the thin client is built
// (scripts/setup.sh) and COCOON_SIM_SERVER is not 0: every call then costs a few ms of CPU.
import { type ChildProcess, spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DEFAULT_CGROUP_PARENT, scopeDir } from './cgroup.ts';
import { imageDigestFor, type SnapshotRecord } from './db.ts';
import {
  checkIcmpKnobs,
  claimGuestNet,
  type GuestNet,
  guestNetSync,
  readGuestNet,
  releaseGuestNet,
} from './guestnet.ts';
import type { Knobs } from './knob-schema.ts';
import { loadKnobs } from './knobs.ts';
import type { Lease } from './leases.ts';
import { type NetControlRecord, netControlLog, netControlSocket } from './netctl.ts';
import { cgroupRootDir } from './paths.ts';

export type { ImageRecord, SnapshotRecord, VmRecord } from './db.ts';
export type { Knobs } from './knob-schema.ts';
export type { Lease } from './leases.ts';

const repo = path.resolve(import.meta.dirname, '..');
/** The simulator executable (a bash shim; `cocoon` behaviour when invoked through a symlink named cocoon). */
export const SIM_BIN = path.join(repo, 'bin', 'cocoon-sim');
const SIM_MAIN = path.join(repo, 'sim', 'main.ts');
const SIM_SERVER = path.join(repo, 'sim', 'server.ts');
/** The thin `cocoon` client (sim/client-go), built by scripts/setup.sh. */
export const CLIENT_BIN = path.join(repo, 'node_modules', '.cache', 'vk-cocoon', 'cocoon-sim-client');
/** cocoon-sim-rusage CMD...: runs CMD and reports its rusage on fd 3 (bench/sim-call.ts). */
export const RUSAGE_BIN = path.join(repo, 'node_modules', '.cache', 'vk-cocoon', 'cocoon-sim-rusage');

/**
 * What a `cocoon` symlink points at: the thin client when it is built (it serves through the
 * root's server, else execs the Node simulator itself), else the bash shim.
 */
function cocoonTarget(): string {
  return fs.existsSync(CLIENT_BIN) ? CLIENT_BIN : SIM_BIN;
}

/** Server mode is on unless COCOON_SIM_SERVER=0 (docs/simulator.md, "Server mode"). */
function serverWanted(env: NodeJS.ProcessEnv): boolean {
  return env.COCOON_SIM_SERVER !== '0';
}

/** One line of <root>/sim/calls.jsonl. */
export interface CallRecord {
  argv: string[];
  exit: number;
  startedAt: string;
  durationMs: number;
  stdinBytes: number;
}

/** One line of <root>/sim/guest.jsonl (a `vm exec`). */
export interface GuestCommand {
  ts: string;
  vmId: string;
  name: string;
  argv: string[];
  env: string[];
  interactive: boolean;
  stdinBytes: number;
  exit: number;
  /** False when cocoon failed before the guest ran it (agent not ready, scripted error). */
  delivered: boolean;
  effect?: string;
  error?: string;
  rule?: number;
}

export interface SimResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  /** stdout as bytes (for `snapshot export -o -`). */
  stdoutBytes: Buffer;
  stderr: string;
  durationMs: number;
}

export interface RunOptions {
  stdin?: string | Uint8Array;
  /** Kill the invocation's process group after this long (default 60 s). */
  timeoutMs?: number;
  env?: NodeJS.ProcessEnv;
  /**
   * Go through the installed `cocoon` symlink and the bash shim, exactly as the provider does.
   * By default the helper starts the thin client directly when the root's server runs, else
   * `node sim/main.ts` (same code, no bash shim).
   */
  viaShim?: boolean;
}

export interface FixtureSnapshotOptions {
  backend?: 'cloud-hypervisor' | 'firecracker';
  os?: 'linux' | 'windows';
  image: string;
  nics?: number;
  /** Static NICs in order, `ip/prefix,gateway` each. */
  staticIps?: string[];
  cpu?: number;
  memory?: number;
  storage?: number;
  network?: string;
  digest?: string;
  /** Also register the base image as pulled. */
  pulled?: boolean;
}

type DeepPartial<T> = T extends readonly unknown[]
  ? T
  : T extends object
    ? { [K in keyof T]?: DeepPartial<T[K]> | null }
    : T;

export interface NewSimRootOptions {
  knobs?: Knobs;
  /** Lease file path (default <root>/net/leases.json). */
  leasesPath?: string;
  /** Parent directory for the temporary directory (default os.tmpdir()). */
  parent?: string;
  /**
   * Start the root's simulator server (default: unless COCOON_SIM_SERVER=0 or the thin client
   * is not built). Without it every call is a Node process of its own.
   */
  server?: boolean;
  /** A guest network namespace whose addresses answer ICMP on demand (sim/guestnet.ts; default
   * as root unless VK_SIM_GUESTNET=0); otherwise loopback guest addresses. */
  guestNetns?: boolean;
}

function mergeDeep(base: unknown, patch: unknown): unknown {
  const isObj = (v: unknown): v is Record<string, unknown> =>
    typeof v === 'object' && v !== null && !Array.isArray(v);
  if (!isObj(base) || !isObj(patch)) return patch;
  const out: Record<string, unknown> = { ...base };
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergeDeep(out[k], v);
  }
  return out;
}

function readJsonl<T>(file: string): T[] {
  let text: string;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch {
    return [];
  }
  return text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as T);
}

/** A private simulator root: its own DBs, run dirs, lease file, knobs and logs. */
export class SimRoot {
  /** The temporary directory holding root/ and bin/. */
  readonly dir: string;
  /** COCOON_ROOT_DIR of this simulator. */
  readonly root: string;
  readonly leasesPath: string;
  /** `<dir>/bin/cocoon`, a symlink to the simulator (the thin client, or bin/cocoon-sim). */
  readonly cocoonBin: string;
  private server: ChildProcess | undefined;

  /** Whether the root's guest network is a network namespace when this process can make one
   * (newSimRoot's `guestNetns`), else loopback addresses. */
  guestNetns = true;

  constructor(dir: string, leasesPath?: string) {
    this.dir = dir;
    this.root = path.join(dir, 'root');
    this.leasesPath = leasesPath ?? path.join(this.root, 'net', 'leases.json');
    this.cocoonBin = path.join(dir, 'bin', 'cocoon');
  }

  /** Environment for anything that runs the simulator against this root (the provider too). */
  env(): Record<string, string> {
    return {
      COCOON_ROOT_DIR: this.root,
      COCOON_SIM_ROOT: this.root,
      COCOON_SIM_LEASES: this.leasesPath,
      NODE_COMPILE_CACHE: process.env.NODE_COMPILE_CACHE || path.join(os.tmpdir(), 'cocoon-sim-node-cache'),
    };
  }

  /** Runs `cocoon <args>`. Never throws for a non-zero exit. */
  run(args: readonly string[], opts: RunOptions = {}): Promise<SimResult> {
    return this.exec('cocoon', args, opts);
  }

  /** Runs `cocoon-sim <args>` (helper verbs: knobs, fixture). */
  helper(args: readonly string[], opts: RunOptions = {}): Promise<SimResult> {
    return this.exec('cocoon-sim', args, opts);
  }

  /** Runs `cocoon <args>`, requires exit 0 and parses stdout as JSON. */
  async json<T = unknown>(args: readonly string[], opts: RunOptions = {}): Promise<T> {
    const r = await this.run(args, opts);
    if (r.code !== 0)
      throw new Error(`cocoon ${args.join(' ')} exited ${r.code ?? r.signal}: ${r.stderr.trim()}`);
    return JSON.parse(r.stdout) as T;
  }

  /** Spawns `cocoon <args>` without waiting (event streams, kill tests); own process group. */
  spawn(args: readonly string[], opts: { env?: NodeJS.ProcessEnv; viaShim?: boolean } = {}) {
    return this.start('cocoon', args, opts.env, opts.viaShim === true);
  }

  private start(
    as: 'cocoon' | 'cocoon-sim',
    args: readonly string[],
    env: NodeJS.ProcessEnv | undefined,
    viaShim: boolean,
  ) {
    const fullEnv = { ...process.env, ...this.env(), ...env };
    const opts = {
      env: fullEnv,
      stdio: ['pipe', 'pipe', 'pipe'] as ['pipe', 'pipe', 'pipe'],
      detached: true,
    };
    if (viaShim) return spawn(as === 'cocoon' ? this.cocoonBin : SIM_BIN, args, opts);
    if (this.serverPid !== undefined && serverWanted(fullEnv)) {
      return spawn(CLIENT_BIN, args, {
        ...opts,
        env: { ...fullEnv, COCOON_SIM_ARGV0: as, COCOON_SIM_HOME: repo },
      });
    }
    return spawn(process.execPath, [SIM_MAIN, ...args], {
      ...opts,
      env: { ...fullEnv, COCOON_SIM_ARGV0: as },
    });
  }

  private exec(as: 'cocoon' | 'cocoon-sim', args: readonly string[], opts: RunOptions): Promise<SimResult> {
    const started = Date.now();
    return new Promise((resolve, reject) => {
      const child = this.start(as, args, opts.env, opts.viaShim === true);
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      child.stdout.on('data', (d: Buffer) => out.push(d));
      child.stderr.on('data', (d: Buffer) => err.push(d));
      child.stdin.on('error', () => {});
      if (opts.stdin !== undefined) child.stdin.end(opts.stdin);
      else child.stdin.end();
      const timer = setTimeout(() => {
        try {
          process.kill(-(child.pid as number), 'SIGKILL');
        } catch {
          // already gone
        }
      }, opts.timeoutMs ?? 60_000);
      child.on('error', (e) => {
        clearTimeout(timer);
        reject(e);
      });
      child.on('close', (code, signal) => {
        clearTimeout(timer);
        const bytes = Buffer.concat(out);
        resolve({
          code,
          signal,
          stdout: bytes.toString('utf8'),
          stdoutBytes: bytes,
          stderr: Buffer.concat(err).toString('utf8'),
          durationMs: Date.now() - started,
        });
      });
    });
  }

  get knobsPath(): string {
    return path.join(this.root, 'sim', 'config.json');
  }

  /** The simulator's cgroup v2 tree (sim/cgroup.ts), the `/sys/fs/cgroup` of its VMs. */
  get cgroupRoot(): string {
    return cgroupRootDir(this.root);
  }

  /** A VM's scope directory (`cpu.stat`, `cgroup.procs`, ...) under `parent` (the
   * COCOON_CGROUP_PARENT the VM was started with; default `cocoon.slice`). */
  cgroupScope(vmId: string, parent = DEFAULT_CGROUP_PARENT): string {
    return scopeDir(this.root, parent, vmId);
  }

  knobs(): Knobs {
    try {
      return JSON.parse(fs.readFileSync(this.knobsPath, 'utf8')) as Knobs;
    } catch {
      return {};
    }
  }

  /** Replaces the knob file (validated). Takes effect on the next invocation. */
  async setKnobs(knobs: Knobs): Promise<void> {
    const { validateKnobs } = await import('./knob-schema.ts');
    validateKnobs(knobs);
    checkIcmpKnobs(this.root, knobs);
    fs.mkdirSync(path.dirname(this.knobsPath), { recursive: true });
    const tmp = `${this.knobsPath}.tmp.${process.pid}`;
    fs.writeFileSync(tmp, JSON.stringify(knobs, null, 2));
    fs.renameSync(tmp, this.knobsPath);
    // A guest told to stop (or start again) answering ICMP does so now.
    guestNetSync(this.root, this.leasesPath, await loadKnobs(this.root));
  }

  /** The guests' network (sim/guestnet.ts): a namespace of its own, or loopback addresses. */
  get guestNet(): GuestNet | undefined {
    return readGuestNet(this.root);
  }

  /** Deep-merges into the knob file: objects merge, arrays replace, `null` deletes. */
  async mergeKnobs(patch: DeepPartial<Knobs>): Promise<Knobs> {
    const next = mergeDeep(this.knobs(), patch) as Knobs;
    await this.setKnobs(next);
    return next;
  }

  calls(): CallRecord[] {
    return readJsonl<CallRecord>(path.join(this.root, 'sim', 'calls.jsonl'));
  }

  /** cocoon-net's control socket of this root (sim/netctl.ts) while the server serves it, else
   * undefined (no server: set VK_COCOON_NET_CONTROL_SOCKET to ''). */
  get netControlSocket(): string | undefined {
    const socket = netControlSocket(this.root);
    return this.serverPid !== undefined && fs.existsSync(socket) ? socket : undefined;
  }

  /** The requests the control socket answered, oldest first. */
  netControlRequests(): NetControlRecord[] {
    return readJsonl<NetControlRecord>(netControlLog(this.root));
  }

  guestCommands(): GuestCommand[] {
    return readJsonl<GuestCommand>(path.join(this.root, 'sim', 'guest.jsonl'));
  }

  /** The lease file's entries (empty when missing or `null`). */
  leases(): Lease[] {
    try {
      const doc = JSON.parse(fs.readFileSync(this.leasesPath, 'utf8')) as Lease[] | null;
      return Array.isArray(doc) ? doc : [];
    } catch {
      return [];
    }
  }

  /** The live lease of a MAC, if any. */
  leaseFor(mac: string): Lease | undefined {
    const now = Date.now();
    return this.leases().find((l) => l.mac === mac.toLowerCase() && Date.parse(l.expiry) > now);
  }

  /** Creates a clonable local snapshot record (see `cocoon-sim fixture snapshot`). */
  async fixtureSnapshot(name: string, o: FixtureSnapshotOptions): Promise<SnapshotRecord> {
    const args = ['fixture', 'snapshot', name, '--image', o.image];
    if (o.backend) args.push('--backend', o.backend);
    if (o.os) args.push('--os', o.os);
    if (o.nics !== undefined) args.push('--nics', String(o.nics));
    for (const s of o.staticIps ?? []) args.push('--static-ip', s);
    if (o.cpu !== undefined) args.push('--cpu', String(o.cpu));
    if (o.memory !== undefined) args.push('--memory', String(o.memory));
    if (o.storage !== undefined) args.push('--storage', String(o.storage));
    if (o.network) args.push('--network', o.network);
    if (o.digest) args.push('--digest', o.digest);
    if (o.pulled) args.push('--pulled');
    const r = await this.helper(args);
    if (r.code !== 0) throw new Error(`fixture snapshot ${name}: ${r.stderr.trim()}`);
    return JSON.parse(r.stdout) as SnapshotRecord;
  }

  /** Registers an image as if pulled. */
  async fixtureImage(ref: string, digest?: string): Promise<void> {
    const r = await this.helper(['fixture', 'image', ref, ...(digest ? ['--digest', digest] : [])]);
    if (r.code !== 0) throw new Error(`fixture image ${ref}: ${r.stderr.trim()}`);
  }

  /**
   * Writes `text` and a NUL at offset 0 of the VM's COW disk (`cocoon __sim disk-write`): a
   * marker in the guest's disk that snapshot save/export/import and clones carry along.
   */
  async diskWrite(vm: string, text: string): Promise<void> {
    const r = await this.run(['__sim', 'disk-write', vm, '--', text]);
    if (r.code !== 0) throw new Error(`__sim disk-write ${vm}: ${r.stderr.trim()}`);
  }

  /** The text at offset 0 of the VM's COW disk up to the first NUL ('' when none). */
  async diskRead(vm: string): Promise<string> {
    const r = await this.run(['__sim', 'disk-read', vm]);
    if (r.code !== 0) throw new Error(`__sim disk-read ${vm}: ${r.stderr.trim()}`);
    return r.stdout.endsWith('\n') ? r.stdout.slice(0, -1) : r.stdout;
  }

  /**
   * Installs a symlink named `cocoon` to the simulator (the thin client when built, else
   * bin/cocoon-sim) into `dir` (default `<dir>/bin`, which exists already) and returns its
   * path: the value for VK_COCOON_BIN.
   */
  async installBin(dir?: string): Promise<string> {
    if (dir === undefined) return this.cocoonBin;
    fs.mkdirSync(dir, { recursive: true });
    const link = path.join(dir, 'cocoon');
    fs.rmSync(link, { force: true });
    fs.symlinkSync(cocoonTarget(), link);
    return link;
  }

  /** The pid of the root's simulator server, while it runs. */
  get serverPid(): number | undefined {
    const s = this.server;
    return s?.pid !== undefined && s.exitCode === null && s.signalCode === null ? s.pid : undefined;
  }

  /**
   * Starts the root's simulator server (sim/server.ts) and waits until it serves. A child of
   * this process, which it never outlives (it exits when its parent changes); stopped by
   * cleanup() or stopServer(). Resolves false when it could not be started (calls then fall
   * back to a Node process each, as with COCOON_SIM_SERVER=0).
   */
  async startServer(): Promise<boolean> {
    if (this.serverPid !== undefined) return true;
    if (!fs.existsSync(CLIENT_BIN)) return false;
    const log = fs.openSync(path.join(this.root, 'sim', 'server.log'), 'a');
    const child = spawn(process.execPath, [SIM_SERVER, this.root], {
      stdio: ['ignore', 'pipe', log],
      env: { ...process.env, ...this.env() },
      cwd: '/',
    });
    fs.closeSync(log);
    const ready = await new Promise<boolean>((resolve) => {
      let text = '';
      const timer = setTimeout(() => resolve(false), 30_000);
      child.stdout?.on('data', (d: Buffer) => {
        text += d.toString();
        if (text.includes('ready\n')) {
          clearTimeout(timer);
          resolve(true);
        }
      });
      child.once('exit', () => {
        clearTimeout(timer);
        resolve(false);
      });
      child.once('error', () => {
        clearTimeout(timer);
        resolve(false);
      });
    });
    child.stdout?.destroy();
    child.unref();
    if (!ready) {
      if (child.exitCode === null) child.kill('SIGKILL');
      process.stderr.write(
        `cocoon-sim: the simulator server did not start (see ${this.root}/sim/server.log)\n`,
      );
      return false;
    }
    this.server = child;
    return true;
  }

  /** Stops the root's simulator server (SIGTERM, SIGKILL after 2 s) and waits until it is gone. */
  async stopServer(): Promise<void> {
    const child = this.server;
    const pid = this.serverPid;
    this.server = undefined;
    if (!child || pid === undefined) return;
    const start = procStartOf(pid);
    const gone = () => child.exitCode !== null || child.signalCode !== null || procStartOf(pid) !== start;
    child.kill('SIGTERM');
    for (let i = 0; i < 200 && !gone(); i++) {
      if (i === 100) child.kill('SIGKILL');
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /**
   * Kills every process the simulator started for this root and stops its server; removes the
   * directory unless keepDir.
   */
  /** Claims the root's guest network unless it has one (newSimRoot; a host coming back after
   * `cleanup({ keepDir: true })` gave its own back). */
  ensureGuestNet(): void {
    if (!readGuestNet(this.root)) claimGuestNet(this.root, { netns: this.guestNetns });
  }

  async cleanup(opts: { keepDir?: boolean } = {}): Promise<void> {
    if (fs.existsSync(this.root)) {
      const r = await this.run(['__sim', 'kill-all'], { timeoutMs: 15_000 }).catch(() => undefined);
      if (r?.code !== 0) this.killRegistered();
    }
    await this.stopServer();
    releaseGuestNet(this.root);
    if (!opts.keepDir) fs.rmSync(this.dir, { recursive: true, force: true });
  }

  /** Fallback for cleanup: SIGKILL every registered process group that is still the same process. */
  private killRegistered(): void {
    const dir = path.join(this.root, 'sim', 'pids');
    let names: string[] = [];
    try {
      names = fs.readdirSync(dir);
    } catch {
      return;
    }
    for (const n of names) {
      try {
        const { pid, start } = JSON.parse(fs.readFileSync(path.join(dir, n), 'utf8')) as {
          pid: number;
          start: number;
        };
        const stat = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
        if (Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]) !== start) continue;
        process.kill(-pid, 'SIGKILL');
      } catch {
        // gone already
      }
    }
  }
}

/** Creates a fresh simulator root in a temporary directory (with `bin/cocoon` installed). */
export async function newSimRoot(opts: NewSimRootOptions = {}): Promise<SimRoot> {
  const dir = fs.mkdtempSync(path.join(opts.parent ?? os.tmpdir(), 'cocoon-sim-'));
  const sim = new SimRoot(dir, opts.leasesPath);
  fs.mkdirSync(path.join(sim.root, 'sim'), { recursive: true });
  fs.mkdirSync(path.dirname(sim.cocoonBin), { recursive: true });
  fs.symlinkSync(cocoonTarget(), sim.cocoonBin);
  sim.guestNetns = opts.guestNetns ?? process.env.VK_SIM_GUESTNET !== '0';
  sim.ensureGuestNet();
  if (opts.knobs) await sim.setKnobs(opts.knobs);
  if (opts.server ?? serverWanted(process.env)) await sim.startServer();
  return sim;
}

/** Start time of a live process (clock ticks since boot), undefined when gone or a zombie. */
function procStartOf(pid: number): number | undefined {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return f[0] === 'Z' || f[0] === 'X' ? undefined : Number(f[19]);
  } catch {
    return undefined;
  }
}

/** The digest `image pull <ref>` produces (without an `images.digests` override). */
export function imageDigest(ref: string): string {
  return imageDigestFor(ref);
}
