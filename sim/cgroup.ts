// The simulator's cgroup v2 tree (docs/simulator.md, "cgroup tree"): for every running VM a
// scope `<root>/sim/cgroup/<COCOON_CGROUP_PARENT>/vm-<id>.scope/` with the files the host's
// `/sys/fs/cgroup/<parent>/vm-<id>.scope/` has that matter here: `cpu.stat` (the CPU the VM's
// stand-in process tree used, from /proc), `cgroup.procs`, and `cpu.max` / `cpu.weight` (the
// clone's CPU flags, recorded, not enforced).
//
// One writer per file at any time: the call that starts the VM builds the scope in a temporary
// directory (a first reading of the new stand-in) and renames it into place, so it appears
// whole; from then on a node stand-in (sim/standin.ts) refreshes its own scope every 500 ms and
// never recreates one that was removed; a `sleep` stand-in uses no CPU after its exec and keeps
// its first reading. The scope goes away with its process, as a systemd transient scope does
// once its last process exits: every kill by the simulator (vm rm, crash, set-state,
// kill-all, a rolled-back clone) removes it.
import fs from 'node:fs';
import path from 'node:path';
import { cgroupRootDir } from './paths.ts';

/** The default of `COCOON_CGROUP_PARENT` (the daemon's too). */
export const DEFAULT_CGROUP_PARENT = 'cocoon.slice';
/** Units of the times in /proc/<pid>/stat. */
const USER_HZ = 100;
const USEC_PER_TICK = 1e6 / USER_HZ;
/** Refresh period of a node stand-in's own scope. */
export const SCOPE_REFRESH_MS = 1000;

/**
 * The cgroup parent of the per-VM scopes: `COCOON_CGROUP_PARENT` of the calling environment
 * (a path relative to the cgroup root, `cocoon.slice` or `machine.slice/cocoon.slice`), else
 * `cocoon.slice`. A value with a `.` or `..` segment would leave the tree: the default instead.
 */
export function cgroupParent(env: NodeJS.ProcessEnv): string {
  const segments = (env.COCOON_CGROUP_PARENT ?? '').split('/').filter((s) => s !== '');
  if (segments.length === 0 || segments.some((s) => s === '.' || s === '..')) return DEFAULT_CGROUP_PARENT;
  return segments.join('/');
}

export const scopeName = (vmId: string) => `vm-${vmId}.scope`;

/** `<root>/sim/cgroup/<parent>/vm-<id>.scope`. */
export function scopeDir(root: string, parent: string, vmId: string): string {
  return path.join(cgroupRootDir(root), parent, scopeName(vmId));
}

export interface ScopeUsage {
  /** utime + cutime of every process of the tree, in microseconds. */
  userUsec: number;
  /** stime + cstime of every process of the tree, in microseconds. */
  systemUsec: number;
  /** The live processes of the tree, ascending. */
  pids: number[];
}

/** [user ticks, system ticks] of one process, its reaped children included; undefined when gone. */
function procTicks(pid: number): [number, number] | undefined {
  let text: string;
  try {
    text = fs.readFileSync(`/proc/${pid}/stat`, 'latin1');
  } catch {
    return undefined;
  }
  // Fields after the parenthesised command name: f[0] is field 3 (state), field n is f[n - 3];
  // utime 14, stime 15, cutime 16, cstime 17.
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
  const n = (i: number) => {
    const v = Number(f[i]);
    return Number.isFinite(v) && v > 0 ? v : 0;
  };
  return [n(11) + n(13), n(12) + n(14)];
}

/** The live children of a process (every thread's `children` list). */
function childrenOf(pid: number): number[] {
  let tids: string[];
  try {
    tids = fs.readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  const out: number[] = [];
  for (const tid of tids) {
    let text = '';
    try {
      text = fs.readFileSync(`/proc/${pid}/task/${tid}/children`, 'latin1');
    } catch {
      continue;
    }
    for (const w of text.split(' ')) {
      const c = Number(w);
      if (Number.isInteger(c) && c > 0) out.push(c);
    }
  }
  return out;
}

/**
 * The CPU of the process tree rooted at `pid`, as a cgroup holding it would count it: every
 * live process's own times plus the times of the children it reaped. Undefined when `pid` is
 * gone. Tick resolution (10 ms): /proc has nothing finer for a whole process.
 */
export function treeUsage(pid: number): ScopeUsage | undefined {
  if (procTicks(pid) === undefined) return undefined;
  let user = 0;
  let system = 0;
  const seen = new Set<number>();
  const todo = [pid];
  while (todo.length > 0 && seen.size < 4096) {
    const p = todo.pop() as number;
    if (seen.has(p)) continue;
    const t = procTicks(p);
    if (!t) continue;
    seen.add(p);
    user += t[0];
    system += t[1];
    todo.push(...childrenOf(p));
  }
  return {
    userUsec: user * USEC_PER_TICK,
    systemUsec: system * USEC_PER_TICK,
    pids: [...seen].sort((a, b) => a - b),
  };
}

/**
 * cgroup v2 `cpu.stat` as a 6.x kernel writes it for a group with the cpu controller enabled.
 * The simulator enforces no `cpu.max`, so the bandwidth counters stay 0 (as for a scope
 * without a quota).
 */
export function cpuStatText(u: Pick<ScopeUsage, 'userUsec' | 'systemUsec'>): string {
  return (
    `usage_usec ${u.userUsec + u.systemUsec}\nuser_usec ${u.userUsec}\nsystem_usec ${u.systemUsec}\n` +
    'nr_periods 0\nnr_throttled 0\nthrottled_usec 0\nnr_bursts 0\nburst_usec 0\n'
  );
}

const procsText = (pids: readonly number[]) => pids.map((p) => `${p}\n`).join('');

export interface CpuPolicy {
  cpu_weight?: number;
  cpu_quota_us?: number;
  cpu_period_us?: number;
}

let tmpCounter = 0;

/**
 * Creates the scope `dir` of the VM whose stand-in is `pid`, whole (built aside, then renamed
 * into place), replacing a leftover of an earlier incarnation. Best effort: a failure leaves
 * no scope (the daemon then reads /proc, as on a host without one).
 */
export function createScope(root: string, dir: string, vmId: string, pid: number, policy: CpuPolicy): void {
  removeScopes(root, [vmId]);
  tmpCounter += 1;
  const tmp = path.join(path.dirname(dir), `.${path.basename(dir)}.tmp.${process.pid}.${tmpCounter}`);
  try {
    fs.mkdirSync(tmp, { recursive: true });
    const u = treeUsage(pid) ?? { userUsec: 0, systemUsec: 0, pids: [] };
    fs.writeFileSync(path.join(tmp, 'cpu.stat'), cpuStatText(u));
    fs.writeFileSync(path.join(tmp, 'cgroup.procs'), procsText(u.pids.length > 0 ? u.pids : [pid]));
    const period = policy.cpu_period_us ?? 100_000;
    fs.writeFileSync(path.join(tmp, 'cpu.max'), `${policy.cpu_quota_us ?? 'max'} ${period}\n`);
    fs.writeFileSync(path.join(tmp, 'cpu.weight'), `${policy.cpu_weight ?? 100}\n`);
    fs.renameSync(tmp, dir);
  } catch {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
}

/** Every scope directory under the tree (temporary ones being built included), by VM ID. */
function findScopes(root: string): Map<string, string[]> {
  const out = new Map<string, string[]>();
  const walk = (dir: string, depth: number) => {
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      return;
    }
    for (const e of entries) {
      if (!e.isDirectory()) continue;
      const p = path.join(dir, e.name);
      const m = /^\.?vm-([^.]+)\.scope(?:\.tmp\..*)?$/.exec(e.name);
      if (m) out.set(m[1] as string, [...(out.get(m[1] as string) ?? []), p]);
      else if (depth < 8) walk(p, depth + 1);
    }
  };
  walk(cgroupRootDir(root), 0);
  return out;
}

/** Removes the scopes of these VMs (all of them, wherever the parent put them). */
export function removeScopes(root: string, vmIds: Iterable<string>): void {
  const ids = new Set(vmIds);
  if (ids.size === 0) return;
  for (const [id, dirs] of findScopes(root)) {
    if (ids.has(id)) for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
  }
}

/**
 * Removes the scope of each (VM, pid) pair whose `cgroup.procs` lists that pid (or cannot be
 * read): the killed process's scope, never the one of a later incarnation of the same VM.
 */
export function removeScopesOf(root: string, procs: readonly { vm: string; pid: number }[]): void {
  if (procs.length === 0) return;
  const scopes = findScopes(root);
  for (const { vm, pid } of procs) {
    for (const d of scopes.get(vm) ?? []) {
      let listed = true;
      try {
        listed = fs.readFileSync(path.join(d, 'cgroup.procs'), 'latin1').split('\n').includes(String(pid));
      } catch {
        // being built or half removed: it goes too
      }
      if (listed) fs.rmSync(d, { recursive: true, force: true });
    }
  }
}

/**
 * Keeps the scope `dir` of the process `pid` (a node stand-in: itself) current: every
 * `intervalMs` its tree's CPU is written to `cpu.stat` (temp file and rename, only when it
 * changed, never lower than before) and its processes to `cgroup.procs`. A scope that does not
 * exist (not created yet, or removed) is left alone. Returns a stop function.
 */
export function followScope(dir: string, pid: number, intervalMs = SCOPE_REFRESH_MS): () => void {
  let last = { userUsec: 0, systemUsec: 0 };
  let lastProcs = '';
  let n = 0;
  const put = (file: string, text: string): boolean => {
    n += 1;
    const tmp = path.join(dir, `.${file}.tmp.${process.pid}.${n}`);
    try {
      fs.writeFileSync(tmp, text);
      fs.renameSync(tmp, path.join(dir, file));
      return true;
    } catch {
      // The scope is gone (or going): nothing to keep up; never recreate it.
      fs.rmSync(tmp, { force: true });
      return false;
    }
  };
  let seeded = false;
  const tick = () => {
    if (!fs.existsSync(dir)) return;
    if (!seeded) {
      // The first reading the starting call put there is the floor.
      seeded = true;
      try {
        const kv = new Map(
          fs
            .readFileSync(path.join(dir, 'cpu.stat'), 'latin1')
            .split('\n')
            .map((l) => l.split(' ') as [string, string]),
        );
        last = { userUsec: Number(kv.get('user_usec')) || 0, systemUsec: Number(kv.get('system_usec')) || 0 };
      } catch {
        // none yet
      }
    }
    const u = treeUsage(pid);
    if (!u) return;
    // A process that leaves the tree takes its times with it; a cgroup never gives time back.
    const next = {
      userUsec: Math.max(u.userUsec, last.userUsec),
      systemUsec: Math.max(u.systemUsec, last.systemUsec),
    };
    if (next.userUsec !== last.userUsec || next.systemUsec !== last.systemUsec) {
      if (put('cpu.stat', cpuStatText(next))) last = next;
    }
    const procs = procsText(u.pids);
    if (procs !== lastProcs && put('cgroup.procs', procs)) lastProcs = procs;
  };
  tick();
  const timer = setInterval(tick, intervalMs);
  return () => clearInterval(timer);
}
