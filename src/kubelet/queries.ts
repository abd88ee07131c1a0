// Query parsing of the kubelet API routes (docs/contracts/virtual-node.md "Kubelet API"). Pure; bad values are
// reported as messages that the server answers with 400.
import type { LogOptions } from './ports.ts';

export type Parsed<T> = { ok: true; value: T } | { ok: false; message: string };

function truthy(v: string | null): boolean {
  return v === '1' || v === 'true';
}

function positiveInt(q: URLSearchParams, name: string, min: number): Parsed<number | undefined> {
  const v = q.get(name);
  if (v === null || v === '') return { ok: true, value: undefined };
  if (!/^-?[0-9]+$/.test(v) || Number(v) < min || !Number.isSafeInteger(Number(v))) {
    return { ok: false, message: `${name}: must be an integer >= ${min}, got ${JSON.stringify(v)}` };
  }
  return { ok: true, value: Number(v) };
}

export function parseLogQuery(q: URLSearchParams): Parsed<LogOptions> {
  const tail = positiveInt(q, 'tailLines', 0);
  if (!tail.ok) return tail;
  const limit = positiveInt(q, 'limitBytes', 1);
  if (!limit.ok) return limit;
  const since = positiveInt(q, 'sinceSeconds', 1);
  if (!since.ok) return since;
  const sinceTimeText = q.get('sinceTime');
  let sinceTime: Date | undefined;
  if (sinceTimeText) {
    sinceTime = new Date(sinceTimeText);
    if (!/^\d{4}-\d{2}-\d{2}T/.test(sinceTimeText) || Number.isNaN(sinceTime.getTime())) {
      return {
        ok: false,
        message: `sinceTime: must be an RFC 3339 timestamp, got ${JSON.stringify(sinceTimeText)}`,
      };
    }
    if (since.value !== undefined)
      return { ok: false, message: 'at most one of sinceTime or sinceSeconds may be specified' };
  }
  return {
    ok: true,
    value: {
      tailLines: tail.value,
      limitBytes: limit.value,
      sinceSeconds: since.value,
      sinceTime,
      follow: truthy(q.get('follow')),
      timestamps: truthy(q.get('timestamps')),
      previous: truthy(q.get('previous')),
    },
  };
}

export interface ExecQuery {
  command: string[];
  stdin: boolean;
  stdout: boolean;
  stderr: boolean;
  tty: boolean;
}

export function parseExecQuery(q: URLSearchParams): Parsed<ExecQuery> {
  const command = q.getAll('command');
  const value: ExecQuery = {
    command,
    stdin: truthy(q.get('input')) || truthy(q.get('stdin')),
    stdout: truthy(q.get('output')) || truthy(q.get('stdout')),
    stderr: truthy(q.get('error')) || truthy(q.get('stderr')),
    tty: truthy(q.get('tty')),
  };
  if (command.length === 0) return { ok: false, message: 'command: at least one is required' };
  if (value.tty && value.stderr) return { ok: false, message: 'tty and stderr cannot both be true' };
  if (!value.stdin && !value.stdout && !value.stderr) {
    return { ok: false, message: 'you must specify at least 1 of stdin, stdout, stderr' };
  }
  return { ok: true, value };
}

/** Splits `/<route>/<ns>/<pod>/<container>` into its parts. */
export function podRoute(
  pathname: string,
  route: string,
): { namespace: string; pod: string; container: string } | undefined {
  const parts = pathname.split('/').filter((p) => p !== '');
  if (parts[0] !== route || parts.length < 4 || parts.length > 5) return undefined;
  // `/<route>/<ns>/<pod>/<container>` or `/<route>/<ns>/<pod>/<uid>/<container>`.
  const [namespace, pod] = parts.slice(1, 3).map(decodeURIComponent) as [string, string];
  const container = decodeURIComponent(parts[parts.length - 1] as string);
  return { namespace, pod, container };
}
