// The one-screen text of an explain report (and its JSON). Pure.
//
// Most of what it prints was written by someone else: annotations, messages and hints by the
// pod author or the guest, event text by anyone who can create events. Every such piece goes
// through escapeControls (util/text.ts) before it reaches the screen, so an escape sequence
// in an annotation (`\x1b]0;pwned\x07`, `\x1b[2J`) is shown, never obeyed, and a newline in
// it cannot forge a line of the report: the only newlines are the ones put here.
import { escapeControls, escapeJsonForTerminal } from '../../util/text.ts';
import type { ExplainReport } from './facts.ts';
import { duration } from './verdict.ts';

const WIDTH = 120;
const LABEL = 11;

const cut = (s: string, n: number) => (s.length <= n ? s : `${s.slice(0, Math.max(0, n - 1))}…`);
/** A foreign multi-line text on one line (its newlines shown as ⏎), escaped. */
const oneLine = (s: string) => escapeControls(s.replace(/\s*\n\s*/g, ' ⏎ '));

/** `HH:MM:SS` of an ISO time, with the date when it is not today's (UTC). */
function clock(iso: string | null, now: Date): string {
  if (!iso) return '--:--:--';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  const t = d.toISOString();
  return t.slice(0, 10) === now.toISOString().slice(0, 10)
    ? t.slice(11, 19)
    : `${t.slice(0, 10)} ${t.slice(11, 19)}`;
}

/** Word-wraps `text` to WIDTH: the first line after `first`, the others after `rest`. A
 * command in backticks is never broken (copied from the screen, it must still run). */
function wrap(text: string, first: string, rest: string): string[] {
  const out: string[] = [];
  let line = '';
  let prefix = first;
  text = escapeControls(text);
  // Words (a backquoted command is one word) and the runs of spaces between them, kept as
  // they are (fields are separated by two spaces); a line breaks only at a run of spaces.
  for (const part of text.match(/(?:`[^`]*`|`|[^ `])+| +/g) ?? []) {
    if (part.startsWith(' ')) line += part;
    else if (line.trim() !== '' && prefix.length + line.length + part.length > WIDTH) {
      out.push(`${prefix}${line.trimEnd()}`);
      prefix = rest;
      line = part;
    } else line += part;
  }
  out.push(`${prefix}${line.trimEnd()}`);
  return out;
}

/** `text` after a label column; continuation lines are indented under the text. */
const field = (label: string, text: string) => wrap(text, label.padEnd(LABEL), ' '.repeat(LABEL));

function list(raw: readonly string[], indent: string, max: number): string[] {
  const lines = raw.map(escapeControls);
  if (lines.length <= max) return lines.map((l) => `${indent}${l}`);
  const head = Math.ceil((max - 1) / 2);
  const tail = max - 1 - head;
  return [
    ...lines.slice(0, head).map((l) => `${indent}${l}`),
    `${indent}… ${lines.length - head - tail} more (-o json lists them all)`,
    ...lines.slice(lines.length - tail).map((l) => `${indent}${l}`),
  ];
}

function specLine(r: ExplainReport): string {
  const s = r.spec;
  if (!r.pod.found) return '—';
  if (!s.ok) return `does not decode: ${s.errors.map((e) => e.message).join('; ')}`;
  const d = s.decoded ?? {};
  const source = d.forkFrom
    ? `fork of ${d.forkFrom}`
    : d.cloneFromDir
      ? `clone of dir ${d.cloneFromDir}`
      : `${d.mode} ${d.mode === 'run' ? '' : 'of '}${d.image || '(no image)'}`;
  const parts = [
    d.vmName ? `vm ${d.vmName}` : 'no vm name',
    source.replace('  ', ' '),
    String(d.os),
    String(d.backend),
    d.managed ? 'managed' : 'unmanaged',
    `generation ${d.generation}`,
  ];
  if (d.hibernate) parts.push('hibernate=true');
  if (d.probePort) parts.push(`probe tcp/${d.probePort}`);
  const warn = s.warnings.length > 0 ? `; warnings: ${s.warnings.map((w) => w.message).join('; ')}` : '';
  return `${parts.join('  ')}${warn}`;
}

function vmLine(r: ExplainReport): string {
  const v = r.vm;
  const head = `id ${v.id ?? '—'}  ip ${v.ip ?? '—'}`;
  const i = v.inspect;
  let tail: string;
  if (i.status === 'found') {
    const rec = i.record;
    const nics = rec.nics
      .map((n, k) => `NIC ${k} ${n.mac}${n.static ? ` static ${n.static}` : ' dhcp'}`)
      .join(', ');
    tail = `cocoon vm inspect: ${rec.state}, ${rec.hypervisor}, pid ${rec.pid}${nics ? `, ${nics}` : ''}`;
  } else if (i.status === 'absent') tail = `cocoon vm inspect ${i.ref}: no such VM on this host`;
  else if (i.status === 'error') tail = `cocoon vm inspect ${i.ref} failed: ${i.error}`;
  else tail = `(cocoon vm inspect skipped: ${i.why})`;
  const saved = v.savedState
    ? v.savedState.status === 'found'
      ? `; local snapshot ${v.savedState.name} (${v.savedState.id})`
      : v.savedState.status === 'absent'
        ? `; no local snapshot ${v.savedState.name}`
        : `; snapshot inspect ${v.savedState.name} failed: ${v.savedState.error}`
    : '';
  return `${head}  ${tail}${saved}`;
}

const WAKE_SOURCES = {
  local: 'the verified local copy',
  peer: 'peer restore from node',
  registry: 'registry pull of',
  other: 'cloned from',
} as const;

function wakeLine(w: NonNullable<ExplainReport['wake']>): string {
  return `${WAKE_SOURCES[w.source]} ${w.from}${w.at ? ` at ${w.at}` : ''}`;
}

export function renderText(r: ExplainReport, now: Date): string {
  const out: string[] = [];
  const p = r.pod;
  out.push(escapeControls(`vk-cocoon explain ${p.namespace}/${p.name}`));
  if (p.found) {
    const node = r.node ? `${p.node} (Ready=${r.node.ready ?? 'unknown'})` : (p.node ?? '—');
    out.push(
      ...field(
        'Pod',
        `uid ${p.uid}  node ${node}  phase ${p.phase ?? '—'}  ${p.ready ? 'Ready' : 'not Ready'}  podIP ${p.podIP ?? '—'}${p.controller ? `  owner ${p.controller}` : ''}${p.deleting ? '  (deleting)' : ''}`,
      ),
    );
  }
  out.push(...field('Verdict', r.headline));
  out.push(...field('VMSpec', specLine(r)));
  if (p.found) {
    const l = r.lifecycle;
    const pcErrors = r.postClone.errors;
    const message = !l.message
      ? ''
      : pcErrors.length > 1 && l.message === pcErrors.join('\n')
        ? `  message: the ${pcErrors.length} post-clone errors (below)`
        : `  message: ${cut(oneLine(l.message), 240)}`;
    out.push(
      ...field(
        'Lifecycle',
        `${l.state ?? '(none)'}  observed generation ${l.observedGeneration ?? '—'} of ${l.generation ?? '0'}${message}`,
      ),
    );
    const s = r.step;
    const stepText = !s
      ? '(no Readiness condition)'
      : `${s.reason} (Readiness=${s.status})${s.reason === 'Failed' && s.message === l.message ? ': the lifecycle message' : `: ${cut(oneLine(s.message), 240)}`}`;
    out.push(...field('Step', stepText));
    out.push(...field('VM', vmLine(r)));
    if (r.wake) out.push(...field('Last wake', wakeLine(r.wake)));
  }
  for (const d of r.deferredPushes) {
    const last = d.lastError ? `; last error: ${cut(oneLine(d.lastError), 160)}` : '';
    out.push(
      ...field(
        'Deferred',
        `${d.repo}:${d.tag} waits for the registry: saved ${clock(d.savedAt, now)}, ${d.attempts} failed tr${d.attempts === 1 ? 'y' : 'ies'}${last}`,
      ),
    );
  }
  // An unreadable ledger matters where a deferred push may be waiting: a deleted pod.
  if (r.deferredError && (!p.found || p.deleting))
    out.push(...field('Deferred', `(the ledger could not be read: ${oneLine(r.deferredError)})`));
  const pc = r.postClone;
  if (pc.state || pc.hint || pc.errors.length > 0) {
    out.push(
      ...field(
        'Post-clone',
        `${pc.state ?? '(none)'}${pc.errors.length > 0 ? `; ${pc.errors.length} error(s):` : ''}`,
      ),
    );
    out.push(
      ...list(
        pc.errors.map((e) => cut(oneLine(e), WIDTH - LABEL - 2)),
        `${' '.repeat(LABEL)}  `,
        5,
      ),
    );
    if (pc.hint !== null) {
      out.push(
        `${' '.repeat(LABEL)}hint, the exact guest commands (${pc.hint.startsWith('powershell ') ? 'one command' : 'sh -c script'}):`,
      );
      out.push(...pc.hint.split('\n').map((l) => `${' '.repeat(LABEL)}  ${escapeControls(l)}`));
    }
    if (pc.hintError) out.push(`${' '.repeat(LABEL)}hint unreadable: ${oneLine(pc.hintError)}`);
  }
  out.push(
    ...field(
      'Events',
      r.eventsError
        ? `(could not be listed: ${r.eventsError})`
        : r.events.length === 0
          ? '(none of ours)'
          : `vk-cocoon's, oldest first${r.otherEvents ? ` (${r.otherEvents} of other components not shown)` : ''}:`,
    ),
  );
  const rows = r.events.map((e) => {
    const age = e.lastTime ? ` ${duration(now.getTime() - Date.parse(e.lastTime))} ago` : '';
    const head = `${clock(e.lastTime, now)}${age}  ${e.type.padEnd(7)} ${e.reason}${e.count > 1 ? ` ×${e.count}` : ''}  `;
    return `${head}${cut(oneLine(e.message), Math.max(20, WIDTH - 2 - head.length))}`;
  });
  out.push(...list(rows, '  ', 9));
  out.push('What to do');
  r.recovery.steps.forEach((s, i) => {
    out.push(...wrap(s, `  ${i + 1}. `, '     '));
  });
  return `${out.join('\n')}\n`;
}

export function renderJson(r: ExplainReport): string {
  return `${escapeJsonForTerminal(JSON.stringify(r, null, 2))}\n`;
}
