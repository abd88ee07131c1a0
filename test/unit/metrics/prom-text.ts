// A strict parser of the Prometheus text format (0.0.4) for tests: it throws on any line it does
// not understand, unescapes label values and HELP text, and keeps timestamps.

export interface PromSample {
  name: string;
  labels: Record<string, string>;
  value: number;
  timestampMs: number | undefined;
  line: string;
}

export interface PromFamily {
  name: string;
  help: string | undefined;
  type: string | undefined;
}

export interface PromText {
  families: Map<string, PromFamily>;
  samples: PromSample[];
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/;
const LABEL = /^[a-zA-Z_][a-zA-Z0-9_]*/;

function unescapeHelp(s: string): string {
  return s.replace(/\\(\\|n)/g, (_m, c: string) => (c === 'n' ? '\n' : '\\'));
}

function parseValue(s: string): number {
  if (s === '+Inf') return Number.POSITIVE_INFINITY;
  if (s === '-Inf') return Number.NEGATIVE_INFINITY;
  if (s === 'NaN') return Number.NaN;
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(s)) throw new Error(`bad value ${JSON.stringify(s)}`);
  return Number(s);
}

function parseSample(line: string): PromSample {
  const nm = NAME.exec(line);
  if (!nm) throw new Error(`bad sample line: ${line}`);
  const name = nm[0];
  let i = name.length;
  const labels: Record<string, string> = {};
  if (line[i] === '{') {
    i++;
    while (line[i] !== '}') {
      const lm = LABEL.exec(line.slice(i));
      if (!lm) throw new Error(`bad label name at ${i}: ${line}`);
      const key = lm[0];
      i += key.length;
      if (line.slice(i, i + 2) !== '="') throw new Error(`expected =" at ${i}: ${line}`);
      i += 2;
      let value = '';
      for (;;) {
        const ch = line[i];
        if (ch === undefined) throw new Error(`unterminated label value: ${line}`);
        if (ch === '"') break;
        if (ch === '\\') {
          const next = line[i + 1];
          if (next === '\\') value += '\\';
          else if (next === '"') value += '"';
          else if (next === 'n') value += '\n';
          else throw new Error(`bad escape \\${next}: ${line}`);
          i += 2;
          continue;
        }
        value += ch;
        i++;
      }
      i++; // closing quote
      if (key in labels) throw new Error(`duplicate label ${key}: ${line}`);
      labels[key] = value;
      if (line[i] === ',') i++;
      else if (line[i] !== '}') throw new Error(`expected , or } at ${i}: ${line}`);
    }
    i++;
  }
  const rest = line.slice(i);
  if (!rest.startsWith(' ')) throw new Error(`expected space after series: ${line}`);
  const parts = rest.trim().split(/ +/);
  if (parts.length < 1 || parts.length > 2) throw new Error(`bad value/timestamp: ${line}`);
  const value = parseValue(parts[0] as string);
  let timestampMs: number | undefined;
  if (parts[1] !== undefined) {
    if (!/^-?\d+$/.test(parts[1])) throw new Error(`bad timestamp: ${line}`);
    timestampMs = Number(parts[1]);
  }
  return { name, labels, value, timestampMs, line };
}

export function parsePromText(text: string): PromText {
  const families = new Map<string, PromFamily>();
  const samples: PromSample[] = [];
  const family = (name: string): PromFamily => {
    let f = families.get(name);
    if (!f) {
      f = { name, help: undefined, type: undefined };
      families.set(name, f);
    }
    return f;
  };
  for (const line of text.split('\n')) {
    if (line === '') continue;
    if (line.startsWith('# HELP ')) {
      const m = /^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*)$/.exec(line);
      if (!m) throw new Error(`bad HELP: ${line}`);
      const f = family(m[1] as string);
      if (f.help !== undefined) throw new Error(`duplicate HELP: ${line}`);
      f.help = unescapeHelp(m[2] as string);
      continue;
    }
    if (line.startsWith('# TYPE ')) {
      const m = /^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped)$/.exec(line);
      if (!m) throw new Error(`bad TYPE: ${line}`);
      const f = family(m[1] as string);
      if (f.type !== undefined) throw new Error(`duplicate TYPE: ${line}`);
      f.type = m[2];
      continue;
    }
    if (line.startsWith('#')) continue;
    samples.push(parseSample(line));
  }
  return { families, samples };
}

/** The family a sample belongs to (histogram `_bucket`/`_sum`/`_count` map to their base). */
export function familyOf(text: PromText, sampleName: string): PromFamily | undefined {
  const direct = text.families.get(sampleName);
  if (direct) return direct;
  const m = /^(.*)_(bucket|sum|count)$/.exec(sampleName);
  return m ? text.families.get(m[1] as string) : undefined;
}
