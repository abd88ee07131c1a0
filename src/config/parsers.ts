// The value parsers of the settings table (src/config/settings.ts). A parser sees a value that
// is set (trimmed; unset or empty means the row's default, except for the rows that give an
// empty value a meaning) and returns the typed value, or reports what is wrong through its
// context: loadConfig prefixes every report with the setting's name, so no message can leave
// the variable out.
import { existsSync, readFileSync } from 'node:fs';
import { isIP, isIPv4 } from 'node:net';
import { parseQuantity, quantityValue } from '../vmspec/quantity.ts';

/** What a parser returns for a bad value (after reporting it): the row's default stands in. */
export const INVALID: unique symbol = Symbol('invalid setting');
export type Invalid = typeof INVALID;

export interface ParseContext {
  /** Reports the whole value as bad: loadConfig says `NAME="value": <what>`. */
  bad(what: string): Invalid;
  /** Reports one bad part of a list value: `NAME: <what>` (kept as it is when it already
   * starts with the name). The value is then bad as a whole. */
  badPart(what: string): void;
}

/** Parses a set value. */
export type Parse<T> = (raw: string, ctx: ParseContext) => T | Invalid;

/** Any non-empty string. */
export const text: Parse<string> = (raw) => raw;

/** One of `allowed`, case-insensitively (the value is lower-cased). */
export function oneOf<const T extends string>(allowed: readonly T[]): Parse<T> {
  return (raw, ctx) => {
    const lower = raw.toLowerCase();
    return (allowed as readonly string[]).includes(lower)
      ? (lower as T)
      : ctx.bad(`expected one of ${allowed.join(', ')}`);
  };
}

/** A decimal integer from `min` to `max`. */
export function int(min: number, max: number): Parse<number> {
  return (raw, ctx) =>
    /^[0-9]+$/.test(raw) && Number(raw) >= min && Number(raw) <= max
      ? Number(raw)
      : ctx.bad(`expected an integer from ${min} to ${max}`);
}

/** `true`/`1` or `false`/`0`. */
export const bool: Parse<boolean> = (raw, ctx) => {
  if (raw === 'true' || raw === '1') return true;
  if (raw === 'false' || raw === '0') return false;
  return ctx.bad('expected true or false');
};

/** A non-negative Kubernetes quantity, kept as written. */
export const quantity: Parse<string> = (raw, ctx) => {
  const q = parseQuantity(raw);
  return q && !q.negative ? raw : ctx.bad('expected a Kubernetes quantity such as 32, 64Gi or 1Ti');
};

/** A storage cap quantity in bytes; `0` is no cap (`undefined`). */
export const storageCap: Parse<bigint | undefined> = (raw, ctx) => {
  const q = parseQuantity(raw);
  if (!q || q.negative) return ctx.bad('expected a Kubernetes quantity such as 32, 64Gi or 1Ti (0: no cap)');
  const bytes = quantityValue(q);
  return bytes === 0n ? undefined : bytes;
};

/** A quantity of bytes per second as a number; `0` is unbounded. */
export const bytesPerSecond: Parse<number> = (raw, ctx) => {
  const q = parseQuantity(raw);
  return q && !q.negative
    ? Number(quantityValue(q))
    : ctx.bad('expected a quantity of bytes per second such as 500Mi (0 = unbounded)');
};

export const ipv4: Parse<string> = (raw, ctx) => (isIPv4(raw) ? raw : ctx.bad('expected an IPv4 address'));

const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;

export const dnsSubdomain: Parse<string> = (raw, ctx) =>
  raw.length <= 253 && DNS_SUBDOMAIN.test(raw)
    ? raw
    : ctx.bad("expected a DNS subdomain (lower-case letters, digits, '-', '.')");

export const labelValue: Parse<string> = (raw, ctx) =>
  raw.length <= 63 && LABEL_VALUE.test(raw)
    ? raw
    : ctx.bad('expected a label value (<= 63 of [A-Za-z0-9-_.])');

export const absolutePath: Parse<string> = (raw, ctx) =>
  raw.startsWith('/') ? raw : ctx.bad('expected an absolute path');

const HOST_PORT = /^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]*):([0-9]{1,5})$/;

/** `host:port`, `[v6]:port` or `:port` (every interface), kept as written. */
export function hostPort(emptyMeans: string): Parse<string> {
  return (raw, ctx) =>
    raw === '' || HOST_PORT.test(raw) ? raw : ctx.bad(`expected host:port or :port (empty ${emptyMeans})`);
}

/** Like {@link hostPort}, split: `{ host, port }` (brackets dropped); empty is `undefined`. */
export function listenAddress(emptyMeans: string): Parse<{ host: string; port: number } | undefined> {
  return (raw, ctx) => {
    if (raw === '') return undefined;
    const m = HOST_PORT.exec(raw);
    const port = Number(m?.[2]);
    const host = (m?.[1] ?? '').replace(/^\[(.*)\]$/, '$1');
    if (!m || port < 1 || port > 65_535 || (host !== '' && host.includes(':') && isIP(host) !== 6))
      return ctx.bad(`expected host:port or :port (empty ${emptyMeans})`);
    return { host, port };
  };
}

const REGISTRY = /^[A-Za-z0-9.-]+(:[0-9]{1,5})?(\/[a-z0-9]+([._-][a-z0-9]+)*)*$/;

/** A registry base `[scheme://]host[:port][/path]`, trailing slashes dropped. */
export const registryBase: Parse<string> = (raw, ctx) => {
  const base = raw.replace(/\/+$/, '');
  return REGISTRY.test(base.replace(/^https?:\/\//, ''))
    ? base
    : ctx.bad('expected host[:port][/path], e.g. europe-docker.pkg.dev/acme/cocoon');
};

/** A file that exists (its path is the value). */
export const existingFile: Parse<string> = (raw, ctx) => (existsSync(raw) ? raw : ctx.bad('no such file'));

/** A PEM certificate bundle: the value is the file's path, the result its contents. */
export const pemBundle: Parse<string> = (raw, ctx) => {
  try {
    const pem = readFileSync(raw, 'utf8');
    return pem.includes('-----BEGIN CERTIFICATE-----') ? pem : ctx.bad('no PEM certificate in it');
  } catch (error) {
    return ctx.bad((error as Error).message);
  }
};

/** Comma-separated CIDRs (a bare address is a /32 or /128). */
export const cidrList: Parse<readonly string[]> = (raw, ctx) => {
  const out: string[] = [];
  for (const cidr of raw
    .split(',')
    .map((c) => c.trim())
    .filter(Boolean)) {
    const [ip = '', bits = ''] = cidr.split('/');
    const family = isIP(ip);
    const max = family === 6 ? 128 : 32;
    if (family === 0 || (bits !== '' && (!/^[0-9]+$/.test(bits) || Number(bits) > max)))
      ctx.badPart(`${JSON.stringify(cidr)} is not a CIDR (e.g. 10.0.0.0/16) or an IP address`);
    else out.push(bits === '' ? `${ip}/${max}` : cidr);
  }
  return out;
};

/** A parser that lends the work to one that returns `{ value, problems }` (src/vmspec's). */
export function withProblems<T>(
  parse: (raw: string) => { readonly value: T; readonly problems: readonly string[] },
): Parse<T> {
  return (raw, ctx) => {
    const { value, problems } = parse(raw);
    for (const p of problems) ctx.badPart(p);
    return value;
  };
}

/** A setting that is refused whenever it is set: `why` says what to set instead. */
export function refused(why: string): Parse<never> {
  return (_raw, ctx) => {
    ctx.badPart(why);
    return INVALID;
  };
}

/** Accepted and ignored. */
export const ignored: Parse<undefined> = () => undefined;
