// `vk-cocoon explain <namespace>/<pod> [-o json]`, the effect half: read the pod, its events
// and its node with the kubeconfig the way kubectl finds it (--kubeconfig, KUBECONFIG, else
// ~/.kube/config), and on the VM's host `cocoon vm inspect` when the cocoon CLI is there; then
// print the report (report.ts) as one text screen or JSON. Read-only: it never writes to the
// apiserver or to cocoon, and it needs nothing from the node's daemon (which may be down).
import { execFile } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { CoreV1Event, CoreV1EventList, V1Node, V1Pod } from '@kubernetes/client-node';
import { LEDGER_FILE } from '../../authority/ledger.ts';
import { inspectArgv, snapshotInspectArgv } from '../../cocoon/argv.ts';
import { formatJsonVerbError, isSnapshotNotFound, isVmNotFound } from '../../cocoon/errors.ts';
import { parseSnapshotRecord, parseVmRecord } from '../../cocoon/records.ts';
import { DEFAULT_STATE_DIR } from '../../config/env.ts';
import { LIFECYCLE_STATE, VM_ID, VM_NAME } from '../../contract/annotations.ts';
import { KubeConfigError, loadKubeConfig } from '../../kube/kubeconfig.ts';
import { ApiError, RestClient } from '../../kube/rest.ts';
import type {
  DeferredLookup,
  DeferredPushFact,
  ExplainFacts,
  NodeFacts,
  SnapshotLookup,
  VmLookup,
} from './facts.ts';
import { renderJson, renderText } from './render.ts';
import { explain } from './report.ts';

export const EXPLAIN_USAGE = `Usage: vk-cocoon explain <namespace>/<pod> [-o text|json] [--kubeconfig <file>]
       vk-cocoon explain -n <namespace> <pod> [-o json]

Explains a VM pod: its decoded VMSpec (or the annotation errors), the lifecycle triple, the
current step and its deadline, vk-cocoon's events for it, the decoded post-clone hint and
attempt errors, the VM record from \`cocoon vm inspect\` (when run on the VM's host: the cocoon
CLI at VK_COCOON_BIN, default /usr/local/bin/cocoon), and what to do. Read-only; works while the
node's daemon is down. The kubeconfig is found as kubectl finds it (KUBECONFIG, ~/.kube/config).
Exit status: 0 with a report, 1 when the pod does not exist (the report lists the events of a
pod of that name) or the apiserver cannot be read, 2 for a usage error.
`;

/** The `vk-cocoon --help` text with the explain usage line in its Usage block. */
export function withExplainUsage(help: string): string {
  const line =
    '       vk-cocoon explain <namespace>/<pod> [-o json]\n' +
    '                             explain a VM pod: state, why, what to do (read-only; explain --help)';
  const at = help.indexOf('\n       vk-cocoon --help');
  return at < 0 ? `${help}\n${line}\n` : `${help.slice(0, at)}\n${line}${help.slice(at)}`;
}

export interface ExplainArgs {
  namespace: string;
  name: string;
  output: 'text' | 'json';
  kubeconfig: string | undefined;
}

/** Parses the arguments after `explain`; a string is the usage error. */
export function parseExplainArgs(argv: readonly string[]): ExplainArgs | 'help' | string {
  let output: 'text' | 'json' = 'text';
  let namespace: string | undefined;
  let kubeconfig: string | undefined;
  const positional: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? '';
    const value = (flag: string): string | undefined => {
      if (a.startsWith(`${flag}=`)) return a.slice(flag.length + 1);
      if (a === flag) return argv[++i];
      if (flag === '-o' && a.startsWith('-o') && a.length > 2) return a.slice(2);
      return undefined;
    };
    if (a === '-h' || a === '--help') return 'help';
    const o = value('-o') ?? value('--output');
    if (o !== undefined) {
      if (o !== 'json' && o !== 'text') return `unknown output format ${JSON.stringify(o)} (text or json)`;
      output = o;
      continue;
    }
    const n = value('-n') ?? value('--namespace');
    if (n !== undefined) {
      namespace = n;
      continue;
    }
    const k = value('--kubeconfig');
    if (k !== undefined) {
      kubeconfig = k;
      continue;
    }
    if (a.startsWith('-')) return `unknown flag ${JSON.stringify(a)}`;
    positional.push(a);
  }
  if (positional.length !== 1) return 'expected one pod: <namespace>/<pod>';
  const ref = positional[0] ?? '';
  const slash = ref.indexOf('/');
  const name = slash < 0 ? ref : ref.slice(slash + 1);
  if (slash >= 0) namespace = ref.slice(0, slash);
  if (!name || !namespace) return 'expected <namespace>/<pod> (or -n <namespace> <pod>)';
  return { namespace, name, output, kubeconfig };
}

const COCOON_TIMEOUT_MS = 10_000;

function cocoon(
  bin: string,
  argv: string[],
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(bin, argv, { timeout: COCOON_TIMEOUT_MS, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
      resolve({
        code,
        stdout: String(stdout),
        stderr: err && code === null ? `${err.message} ${stderr}` : String(stderr),
      });
    });
  });
}

/** The cocoon CLI of this host, or why it is not used. */
function cocoonBin(env: NodeJS.ProcessEnv, pod: V1Pod): { bin: string } | { why: string } {
  const bin = env.VK_COCOON_BIN || '/usr/local/bin/cocoon';
  try {
    accessSync(bin, constants.X_OK);
  } catch {
    return { why: `no cocoon CLI at ${bin} (run explain on the VM's host, or set VK_COCOON_BIN)` };
  }
  const here = env.VK_NODE_NAME;
  const there = pod.spec?.nodeName;
  if (here && there && here !== there) return { why: `this host is node ${here}; the pod is on ${there}` };
  return { bin };
}

async function lookupVm(bin: string, ref: string): Promise<VmLookup> {
  const r = await cocoon(bin, inspectArgv(ref));
  if (r.code === 0) {
    const rec = parseVmRecord(r.stdout);
    return rec.ok ? { status: 'found', ref, record: rec.value } : { status: 'error', ref, error: rec.error };
  }
  if (isVmNotFound(r.stderr)) return { status: 'absent', ref };
  return { status: 'error', ref, error: formatJsonVerbError({ code: r.code, signal: null }, r.stderr) };
}

async function lookupSnapshot(bin: string, name: string): Promise<SnapshotLookup> {
  const r = await cocoon(bin, snapshotInspectArgv(name));
  if (r.code === 0) {
    const rec = parseSnapshotRecord(r.stdout);
    return rec.ok ? { status: 'found', name, id: rec.value.id } : { status: 'error', name, error: rec.error };
  }
  if (isSnapshotNotFound(r.stderr)) return { status: 'absent', name };
  return { status: 'error', name, error: formatJsonVerbError({ code: r.code, signal: null }, r.stderr) };
}

/** The pod's deferred delete-time pushes from the provenance ledger of this host's daemon
 * (read-only; `undefined` when this host has none: not the VM's host). */
async function lookupDeferred(env: NodeJS.ProcessEnv, podKey: string): Promise<DeferredLookup | undefined> {
  const path = join(env.VK_STATE_DIR || DEFAULT_STATE_DIR, LEDGER_FILE);
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') return undefined;
    return {
      status: 'error',
      error: `${path}: ${(err as Error).message} (the ledger is mode 0600: run explain as its owner)`,
    };
  }
  try {
    const doc = JSON.parse(text) as { pushes?: Record<string, Partial<DeferredPushFact> & { pod?: string }> };
    const pushes = Object.values(doc.pushes ?? {})
      .filter((p) => p.pod === podKey)
      .map((p) => ({
        repo: String(p.repo ?? ''),
        tag: String(p.tag ?? ''),
        savedAt: String(p.savedAt ?? ''),
        attempts: Number(p.attempts ?? 0),
        lastError: String(p.lastError ?? ''),
        lastAttemptAt: String(p.lastAttemptAt ?? ''),
      }));
    return { status: 'read', pushes };
  } catch (err) {
    return { status: 'error', error: `${path}: ${(err as Error).message}` };
  }
}

/** Reads the facts of one pod. Throws KubeConfigError or the API error of the pod read. */
export async function gatherFacts(args: ExplainArgs, env: NodeJS.ProcessEnv): Promise<ExplainFacts> {
  const access = loadKubeConfig(args.kubeconfig ?? env.KUBECONFIG, env);
  const rest = new RestClient(access, { timeoutMs: 15_000, userAgent: 'vk-cocoon-explain' });
  const ns = encodeURIComponent(args.namespace);
  try {
    let pod: V1Pod | undefined;
    try {
      pod = await rest.request<V1Pod>({
        method: 'GET',
        path: `/api/v1/namespaces/${ns}/pods/${encodeURIComponent(args.name)}`,
      });
    } catch (err) {
      if (!(err instanceof ApiError && err.code === 404)) throw err;
    }
    const selector = [
      `involvedObject.namespace=${args.namespace}`,
      `involvedObject.name=${args.name}`,
      ...(pod?.metadata?.uid ? [`involvedObject.uid=${pod.metadata.uid}`] : ['involvedObject.kind=Pod']),
    ].join(',');
    let eventsError: string | undefined;
    const [events, node] = await Promise.all([
      rest
        .request<CoreV1EventList>({
          method: 'GET',
          path: `/api/v1/namespaces/${ns}/events`,
          query: { fieldSelector: selector },
        })
        .then(
          (l) => l.items as CoreV1Event[],
          (err: unknown) => {
            eventsError = err instanceof Error ? err.message : String(err);
            return [];
          },
        ),
      pod?.spec?.nodeName ? readNode(rest, pod.spec.nodeName) : Promise.resolve(undefined),
    ]);
    const deferred = await lookupDeferred(env, `${args.namespace}/${args.name}`);
    let vm: VmLookup | undefined;
    let savedState: SnapshotLookup | undefined;
    if (pod) {
      const ann = pod.metadata?.annotations ?? {};
      const ref = ann[VM_ID] || ann[VM_NAME] || '';
      const where = cocoonBin(env, pod);
      if (!ref) vm = { status: 'skipped', why: 'the pod names no VM' };
      else if ('why' in where) vm = { status: 'skipped', why: where.why };
      else {
        const state = ann[LIFECYCLE_STATE];
        const hib = (state === 'hibernated' || state === 'hibernating') && ann[VM_NAME];
        [vm, savedState] = await Promise.all([
          lookupVm(where.bin, ref),
          hib ? lookupSnapshot(where.bin, ann[VM_NAME] ?? '') : Promise.resolve(undefined),
        ]);
      }
    }
    return {
      namespace: args.namespace,
      name: args.name,
      pod,
      events,
      eventsError,
      node,
      vm,
      savedState,
      deferred,
      now: new Date(),
    };
  } finally {
    rest.close();
  }
}

async function readNode(rest: RestClient, name: string): Promise<NodeFacts> {
  try {
    const node = await rest.request<V1Node>({
      method: 'GET',
      path: `/api/v1/nodes/${encodeURIComponent(name)}`,
    });
    const c = node.status?.conditions?.find((x) => x.type === 'Ready');
    return {
      name,
      ready: c?.status,
      since: c?.lastTransitionTime ? String(c.lastTransitionTime) : undefined,
      message: c?.message,
    };
  } catch {
    return { name, ready: undefined, since: undefined, message: undefined };
  }
}

function write(stream: NodeJS.WritableStream, text: string): Promise<void> {
  return new Promise((resolve) => stream.write(text, () => resolve()));
}

/** The `explain` command; resolves with the exit status. */
export async function runExplain(
  argv: readonly string[],
  io: { env: NodeJS.ProcessEnv; stdout: NodeJS.WritableStream; stderr: NodeJS.WritableStream },
): Promise<number> {
  const args = parseExplainArgs(argv);
  if (args === 'help') {
    await write(io.stdout, EXPLAIN_USAGE);
    return 0;
  }
  if (typeof args === 'string') {
    await write(io.stderr, `vk-cocoon explain: ${args}\n\n${EXPLAIN_USAGE}`);
    return 2;
  }
  let facts: ExplainFacts;
  try {
    facts = await gatherFacts(args, io.env);
  } catch (err) {
    const why =
      err instanceof KubeConfigError
        ? err.message
        : `reading the pod: ${err instanceof Error ? err.message : String(err)}`;
    await write(io.stderr, `vk-cocoon explain: ${why}\n`);
    return 1;
  }
  const report = explain(facts);
  await write(io.stdout, args.output === 'json' ? renderJson(report) : renderText(report, facts.now));
  return report.pod.found ? 0 : 1;
}
