// Structured JSON logging, one line per record. Child loggers carry `pod` and `vm` keys so every
// line about a pod or VM can be found with one filter.
//
// The lines are pino's (the daemon used pino until the memory pass of docs/decisions.md "Daemon
// memory", and test/unit/util/log.test.ts checks the two print the same bytes): `level` as a
// label, `time` as an ISO string, `component`, the child bindings, the record's keys in their
// order, then `msg`. Written here because pino and the modules it loads (thread-stream,
// worker_threads, sonic-boom, its serializers and redaction) stayed in the daemon's memory for
// its whole life while the daemon uses only this: levels, child bindings, `(object, message)`
// and `(message)` calls, writes to one stream.

export type LogLevel = 'trace' | 'debug' | 'info' | 'warn' | 'error' | 'fatal';

export interface LogFn {
  (obj: object | null | undefined, msg?: string): void;
  (msg: string): void;
}

export interface Logger {
  /** The configured level (`silent`: nothing is written). */
  readonly level: string;
  child(bindings: Record<string, unknown>): Logger;
  isLevelEnabled(level: string): boolean;
  trace: LogFn;
  debug: LogFn;
  info: LogFn;
  warn: LogFn;
  error: LogFn;
  fatal: LogFn;
}

const LEVELS: Readonly<Record<string, number>> = {
  trace: 10,
  debug: 20,
  info: 30,
  warn: 40,
  error: 50,
  fatal: 60,
  silent: Number.POSITIVE_INFINITY,
};

/** pino's standard `err` serializer for an Error under the `err` key: type, message (with the
 * messages of its causes), stack, and its own enumerable properties. The daemon itself logs
 * error messages as strings; this keeps an Error that reaches a record readable. */
function serializeErr(err: Error): Record<string, unknown> {
  let message = err.message;
  let stack = err.stack ?? '';
  const seen = new Set<unknown>([err]);
  for (let c: unknown = err.cause; c instanceof Error && !seen.has(c); c = c.cause) {
    seen.add(c);
    message += `: ${c.message}`;
    stack += `\ncaused by: ${c.stack ?? ''}`;
  }
  const out: Record<string, unknown> = { type: err.constructor?.name ?? 'Error', message, stack };
  for (const [k, v] of Object.entries(err)) if (!(k in out) && k !== 'cause') out[k] = v;
  return out;
}

/** A value as pino writes it, or undefined for a key it leaves out. */
function valueJson(key: string, value: unknown): string | undefined {
  if (key === 'err' && value instanceof Error) value = serializeErr(value);
  switch (typeof value) {
    case 'undefined':
    case 'function':
    case 'symbol':
      return undefined;
    case 'number':
      return Number.isFinite(value) ? String(value) : 'null';
    case 'boolean':
      return String(value);
    case 'string':
      return JSON.stringify(value);
    default:
      return stringify(value);
  }
}

/** JSON.rawJSON (Node 24; not in the TypeScript lib this project targets). */
const rawJSON = (JSON as unknown as { rawJSON(text: string): unknown }).rawJSON;

/** JSON.stringify, with BigInts as numbers and cycles as "[Circular]" (pino's fallback). */
function stringify(value: unknown): string {
  try {
    return JSON.stringify(value);
  } catch {
    const seen = new WeakSet<object>();
    return JSON.stringify(value, function (this: unknown, _k, v: unknown) {
      if (typeof v === 'bigint') return rawJSON(v.toString());
      if (typeof v === 'object' && v !== null) {
        if (seen.has(v)) return '[Circular]';
        seen.add(v);
      }
      return v;
    });
  }
}

/** `,"key":value` for every key of `obj` pino would write (in order, inherited included; a
 * `msg` key too, before the message), except a key the logger's bindings already hold with the
 * same value (a record that repeats a binding, such as `vmId`, writes it once). */
function propsJson(obj: object, bound: ReadonlyMap<string, string>): string {
  let out = '';
  for (const key in obj) {
    const json = valueJson(key, (obj as Record<string, unknown>)[key]);
    if (json !== undefined && bound.get(key) !== json) out += `,${JSON.stringify(key)}:${json}`;
  }
  return out;
}

class JsonLogger implements Logger {
  readonly level: string;
  readonly #threshold: number;
  readonly #out: NodeJS.WritableStream;
  /** The bindings of this logger and its parents, key → JSON value (a child's value of a key
   * its parent bound replaces it in place: each key is written once). */
  readonly #bound: ReadonlyMap<string, string>;
  /** The same, as `,"key":value...`. */
  readonly #bindings: string;

  constructor(level: string, out: NodeJS.WritableStream, bound: ReadonlyMap<string, string>) {
    const threshold = LEVELS[level];
    if (threshold === undefined) throw new Error(`unknown level ${level}`);
    this.level = level;
    this.#threshold = threshold;
    this.#out = out;
    this.#bound = bound;
    let bindings = '';
    for (const [key, json] of bound) bindings += `,${JSON.stringify(key)}:${json}`;
    this.#bindings = bindings;
    // No-op methods below the level: a disabled call costs a function call, nothing more.
    for (const name of ['trace', 'debug', 'info', 'warn', 'error', 'fatal'] as const) {
      const n = LEVELS[name] as number;
      this[name] = n >= threshold ? (a: unknown, b?: unknown) => this.#write(name, a, b) : noop;
    }
  }

  trace: LogFn = noop;
  debug: LogFn = noop;
  info: LogFn = noop;
  warn: LogFn = noop;
  error: LogFn = noop;
  fatal: LogFn = noop;

  isLevelEnabled(level: string): boolean {
    const n = LEVELS[level];
    return n !== undefined && n !== LEVELS.silent && n >= this.#threshold;
  }

  child(bindings: Record<string, unknown>): Logger {
    const bound = new Map(this.#bound);
    for (const key in bindings) {
      const value = bindings[key];
      if (value === undefined) continue;
      bound.set(key, stringify(value));
    }
    return new JsonLogger(this.level, this.#out, bound);
  }

  #write(level: LogLevel, a: unknown, b: unknown): void {
    let obj: object | undefined;
    let msg: unknown;
    if (typeof a === 'object' && a !== null) {
      if (a instanceof Error) {
        obj = { err: a };
        msg = b === undefined ? a.message : b;
      } else {
        obj = a;
        msg = b;
      }
    } else {
      msg = a === undefined || a === null ? b : a;
    }
    let line = `{"level":"${level}","time":"${new Date().toISOString()}"${this.#bindings}`;
    if (obj) line += propsJson(obj, this.#bound);
    if (msg !== undefined) line += `,"msg":${typeof msg === 'string' ? JSON.stringify(msg) : stringify(msg)}`;
    this.#out.write(`${line}}\n`);
  }
}

function noop(): void {}

export function createLogger(level: string, destination: NodeJS.WritableStream = process.stderr): Logger {
  return new JsonLogger(level, destination, new Map([['component', '"vk-cocoon"']]));
}

/** A logger that discards everything (unit tests of modules that take a logger). */
export const silentLogger: Logger = new JsonLogger('silent', process.stdout, new Map());
