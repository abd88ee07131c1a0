/**
 * Registry authentication, pure parts (docs/registry.md "Authentication"): `WWW-Authenticate` challenges, the
 * token endpoint's answer, scopes, Basic headers, docker config credentials and the
 * plain-HTTP credential rule.
 */
import { isLoopbackHost } from '../util/loopback.ts';

/** One challenge of a `WWW-Authenticate` header; the scheme is lower-cased. */
export interface Challenge {
  readonly scheme: string;
  /** Auth-param names are lower-cased; values are unquoted and unescaped. */
  readonly params: Readonly<Record<string, string>>;
}

/** A username and password (docker config `auth`, or a Google access token later). */
export interface Credential {
  readonly username: string;
  readonly password: string;
}

/** What a token endpoint answered. */
export interface BearerToken {
  readonly token: string;
  /** Lifetime in seconds (`expires_in`, default 60). */
  readonly expiresInSeconds: number;
}

/** Default token lifetime when `expires_in` is absent (docs/registry.md "Authentication"). */
export const DEFAULT_TOKEN_SECONDS = 60;

const TOKEN68_OR_NAME = /[A-Za-z0-9!#$%&'*+.^_`|~/=-]/;

/**
 * Parses a `WWW-Authenticate` header value (RFC 9110 §11.6.1) into its challenges:
 * `Bearer realm="https://auth/token",service="reg",scope="repository:a/b:pull,push"` — note
 * the comma inside the quoted scope — or several challenges separated by commas
 * (`Basic realm="x", Bearer realm="y"`). Malformed tails are ignored; never throws.
 */
export function parseWwwAuthenticate(header: string): Challenge[] {
  const challenges: { scheme: string; params: Record<string, string> }[] = [];
  let i = 0;
  const n = header.length;
  const skipSpace = () => {
    while (i < n && (header[i] === ' ' || header[i] === '\t')) i++;
  };
  const readToken = (): string => {
    const start = i;
    while (i < n && TOKEN68_OR_NAME.test(header[i]!) && header[i] !== '=') i++;
    return header.slice(start, i);
  };
  const readQuoted = (): string => {
    // header[i] === '"'
    i++;
    let out = '';
    while (i < n && header[i] !== '"') {
      if (header[i] === '\\' && i + 1 < n) i++;
      out += header[i];
      i++;
    }
    i++; // closing quote (or end)
    return out;
  };
  let current: { scheme: string; params: Record<string, string> } | undefined;
  while (i < n) {
    skipSpace();
    if (header[i] === ',') {
      i++;
      continue;
    }
    const word = readToken();
    if (word === '') {
      i++; // skip a stray character
      continue;
    }
    skipSpace();
    if (header[i] === '=') {
      // An auth-param of the current challenge (or a token68 with padding).
      i++;
      skipSpace();
      const value = header[i] === '"' ? readQuoted() : readToken();
      if (current) current.params[word.toLowerCase()] = value;
      continue;
    }
    // A new challenge: `scheme` followed by a space or the end (or a comma).
    current = { scheme: word.toLowerCase(), params: {} };
    challenges.push(current);
  }
  return challenges;
}

/** `repository:<name>:<actions>` (docs/registry.md "Authentication"), actions in the given order. */
export function repositoryScope(name: string, actions: readonly string[]): string {
  return `repository:${name}:${actions.join(',')}`;
}

/**
 * The token request URL: `<realm>?service=<s>&scope=<scope>` (existing query parameters of the
 * realm are kept). Throws for a realm that is not an absolute http(s) URL.
 */
export function tokenUrl(challenge: Challenge, scope: string): URL {
  const realm = challenge.params.realm;
  if (realm === undefined || realm === '') throw new Error('bearer challenge without realm');
  const url = new URL(realm);
  if (url.protocol !== 'https:' && url.protocol !== 'http:')
    throw new Error(`bearer realm ${realm}: not http(s)`);
  if (challenge.params.service !== undefined) url.searchParams.set('service', challenge.params.service);
  url.searchParams.set('scope', scope);
  return url;
}

/** Decodes a token endpoint answer: `token` or `access_token`, optional `expires_in`. */
export function parseTokenResponse(body: string): BearerToken {
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    throw new Error('token endpoint answered non-JSON');
  }
  if (typeof json !== 'object' || json === null) throw new Error('token endpoint answered a non-object');
  const o = json as Record<string, unknown>;
  const token =
    typeof o.token === 'string' && o.token !== ''
      ? o.token
      : typeof o.access_token === 'string' && o.access_token !== ''
        ? o.access_token
        : undefined;
  if (token === undefined) throw new Error('token endpoint answer has neither token nor access_token');
  const expires = o.expires_in;
  const expiresInSeconds =
    typeof expires === 'number' && Number.isFinite(expires) && expires > 0 ? expires : DEFAULT_TOKEN_SECONDS;
  return { token, expiresInSeconds };
}

/**
 * When a cached token stops being used: a little before its expiry (10% of its lifetime, at
 * most 30 s) so a request never leaves with a token that expires in flight.
 */
export function tokenExpiresAt(nowMs: number, expiresInSeconds: number): number {
  const lifetimeMs = expiresInSeconds * 1000;
  return nowMs + lifetimeMs - Math.min(30_000, lifetimeMs / 10);
}

/**
 * The plain-HTTP credential rule (docs/registry.md "Authentication"): a credential of ours
 * (Basic, or the bearer token it buys) never travels over plain HTTP to a host that is not
 * loopback (src/util/loopback.ts), where anyone on the path reads it. `scheme` is `http` or
 * `https` (a URL protocol's trailing `:` is accepted); `host` is `host[:port]`. Returns the
 * refusal, naming the host and the rule, or `undefined` when sending is fine.
 */
export function plainHttpCredentialRefusal(scheme: string, host: string, what: string): string | undefined {
  if (scheme.replace(/:$/, '') !== 'http' || isLoopbackHost(host)) return undefined;
  return `${what}: refusing to send registry credentials over plain HTTP to ${host}: credentials go over plain HTTP only to a loopback host (127.0.0.0/8, ::1, localhost); use https:// for ${host}, or remove its credentials for anonymous access`;
}

/** `Basic <base64(user:password)>`. */
export function basicAuthorization(cred: Credential): string {
  return `Basic ${Buffer.from(`${cred.username}:${cred.password}`, 'utf8').toString('base64')}`;
}

/** A docker config `auths` key reduced to `host[:port]` (scheme and path dropped, lower-case). */
function normalizeAuthKey(key: string): string {
  return key
    .trim()
    .replace(/^[a-z]+:\/\//i, '')
    .replace(/\/.*$/, '')
    .toLowerCase();
}

function decodeAuthEntry(entry: unknown): Credential | undefined {
  if (typeof entry !== 'object' || entry === null) return undefined;
  const e = entry as Record<string, unknown>;
  if (typeof e.auth === 'string' && e.auth !== '') {
    const text = Buffer.from(e.auth, 'base64').toString('utf8');
    const colon = text.indexOf(':');
    if (colon <= 0) return undefined;
    return { username: text.slice(0, colon), password: text.slice(colon + 1) };
  }
  if (typeof e.username === 'string' && e.username !== '' && typeof e.password === 'string') {
    return { username: e.username, password: e.password };
  }
  return undefined;
}

/**
 * The credential for `host` (`host[:port]`) in a parsed docker config: `auths.<host>.auth`
 * (base64 `user:password`), or plain `username`/`password` fields. An exact key wins over a key
 * that only matches once its scheme and path are dropped (`https://host/v1/`). A host served by
 * a credential helper ({@link credentialHelperFor}) is looked up there instead.
 */
export function dockerConfigCredential(config: unknown, host: string): Credential | undefined {
  if (typeof config !== 'object' || config === null) return undefined;
  const auths = (config as Record<string, unknown>).auths;
  if (typeof auths !== 'object' || auths === null) return undefined;
  const entries = auths as Record<string, unknown>;
  if (Object.hasOwn(entries, host)) {
    const exact = decodeAuthEntry(entries[host]);
    if (exact) return exact;
  }
  const wanted = host.toLowerCase();
  for (const [key, entry] of Object.entries(entries)) {
    if (normalizeAuthKey(key) !== wanted) continue;
    const cred = decodeAuthEntry(entry);
    if (cred) return cred;
  }
  return undefined;
}

/** A `docker-credential-<name>` suffix: a plain program name, never a path or an option. */
const HELPER_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

/**
 * The credential helper that holds `host`'s credential in a parsed docker config, as the docker
 * CLI decides it: `credHelpers.<host>` (an exact key, else one equal once its scheme and path are
 * dropped), else `credsStore`, else none (then `auths`). Throws on a helper name that is not a
 * plain program name (`docker-credential-<name>` is run from PATH, never a path).
 */
export function credentialHelperFor(config: unknown, host: string): string | undefined {
  if (typeof config !== 'object' || config === null) return undefined;
  const c = config as Record<string, unknown>;
  let name: unknown;
  const helpers = c.credHelpers;
  if (typeof helpers === 'object' && helpers !== null) {
    const entries = helpers as Record<string, unknown>;
    if (Object.hasOwn(entries, host)) name = entries[host];
    else {
      const wanted = host.toLowerCase();
      const key = Object.keys(entries).find((k) => normalizeAuthKey(k) === wanted);
      if (key !== undefined) name = entries[key];
    }
  }
  if (name === undefined || name === '') name = c.credsStore;
  if (name === undefined || name === '') return undefined;
  if (typeof name !== 'string' || !HELPER_NAME.test(name))
    throw new Error(`docker config: credential helper ${JSON.stringify(name)} is not a plain program name`);
  return name;
}

/**
 * A `docker-credential-<name> get` answer (`{"ServerURL","Username","Secret"}`), or `undefined`
 * for none. An identity token (`Username: "<token>"`, an OAuth2 refresh token) is refused: this
 * client does not run the refresh-token grant.
 */
export function parseHelperAnswer(helper: string, stdout: string): Credential {
  let o: unknown;
  try {
    o = JSON.parse(stdout);
  } catch {
    throw new Error(`docker-credential-${helper} get: the answer is not JSON`);
  }
  const a = (typeof o === 'object' && o !== null ? o : {}) as Record<string, unknown>;
  if (typeof a.Username !== 'string' || typeof a.Secret !== 'string' || a.Secret === '')
    throw new Error(`docker-credential-${helper} get: the answer has no Username and Secret`);
  if (a.Username === '<token>')
    throw new Error(
      `docker-credential-${helper} get: an identity token (OAuth2 refresh token) is not supported; store a username and password or token for the registry`,
    );
  return { username: a.Username, password: a.Secret };
}
