/**
 * The registry transport (docs/registry.md "Transport and errors"): every request goes through
 * {@link RegistryTransport.request}, which takes a method, the action set (`pull` for reads,
 * `pull,push` for uploads and manifest PUT, `pull,push,delete` for DELETE) and an optional
 * replayable body: a buffer, or a {@link StreamBody} opened afresh for each send, so a layer is
 * streamed from its file and never held in memory. It adds the `Authorization` header
 * (authorization.ts; one retry after a 401 challenge), asks a busy registry (429, 503) again
 * after its `Retry-After` ({@link busyWaitMs}), and follows redirects when asked.
 *
 * node:http/https over HTTP/1.1 with a keep-alive pool of up to 32 idle sockets per host
 * (`maxFreeSockets`), chosen over the global fetch because it exposes exactly that pool setting
 * and real stream backpressure. Redirects on blob GET are followed by hand so the
 * `Authorization` header never reaches another host.
 */
import type * as Http from 'node:http';
import https from 'node:https';
import type { Readable } from 'node:stream';
import { setTimeout as sleep } from 'node:timers/promises';
import { getCACertificates } from 'node:tls';
import type { Logger } from '../log.ts';
import { VERSION } from '../version.ts';
import { parseWwwAuthenticate } from './auth.ts';
import { RegistryAuthorization } from './authorization.ts';
import { bulkGet } from './bulk-get.ts';
import type { CredentialSource } from './credentials.ts';
import { drain, networkError, RegistryError, type RegistryResponse, statusError } from './errors.ts';
import { writeFileRange } from './file-body.ts';
import { type RegistryBase, registryOrigin } from './reference.ts';
import { SlabPool } from './slab-pool.ts';

// node:http through process.getBuiltinModule, not an ES import: src/kube/rest.ts says why.
const http = process.getBuiltinModule('node:http');

/** Options of a single registry request (the building block of every verb). */
export interface RegistryRequest {
  readonly method: 'GET' | 'HEAD' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  /** Repository the request acts on (the token scope); `''` for `/v2/`. */
  readonly repository: string;
  /** Path on the registry (`/v2/...`) or an absolute URL on the registry host (upload locations). */
  readonly path: string;
  /** Token actions; default `['pull']`. */
  readonly actions?: readonly string[];
  readonly headers?: Readonly<Record<string, string>>;
  /** A replayable body (sent again after a 401 challenge). */
  readonly body?: Buffer | StreamBody;
  /** Follow 301/302/303/307/308 (blob GET), dropping `Authorization` for other hosts. */
  readonly followRedirects?: boolean;
  /** A blob body: a GET sent on a connection of its own (bulk-get.ts), unless a proxy is set. */
  readonly bulk?: boolean;
  readonly signal?: AbortSignal;
}

/**
 * A request body streamed from somewhere else (a spooled layer file): `open` is called once per
 * send (again after a 401 challenge) and must yield exactly `length` bytes.
 */
export type StreamBody =
  | { readonly length: number; readonly open: () => Readable }
  /** A range of a file, sent through reused buffers (file-body.ts). */
  | { readonly length: number; readonly file: string; readonly start: number };

/** Token actions: reads; uploads and manifest PUT; DELETE. */
export const PULL: readonly string[] = ['pull'];
export const PUSH: readonly string[] = ['pull', 'push'];
/** distribution maps DELETE to the `delete` action of the token scope. */
export const DELETE: readonly string[] = ['pull', 'push', 'delete'];

/** Proxy settings: with any of them set, blob GETs stay on node:http (bulk-get.ts never proxies). */
const PROXY_VARIABLES = ['HTTPS_PROXY', 'https_proxy', 'HTTP_PROXY', 'http_proxy', 'NODE_USE_ENV_PROXY'];

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
/** Answers that ask the client to come back later (Too Many Requests, Service Unavailable). */
const BUSY_STATUS = new Set([429, 503]);
/** Tries of one request while the registry answers busy (the last busy answer is the error). */
export const BUSY_ATTEMPTS = 4;
const BUSY_MAX_WAIT_MS = 30_000;

/**
 * How long to wait before trying a busy registry again: its `Retry-After` (delta-seconds or an
 * HTTP date, RFC 9110 §10.2.3), else 0.5 s doubling per try; never more than 30 s. Pure.
 */
export function busyWaitMs(retryAfter: string | undefined, tries: number, now: number): number {
  const backoff = 500 * 2 ** tries;
  const text = retryAfter?.trim() ?? '';
  let ms: number | undefined;
  if (/^\d+$/.test(text)) ms = Number(text) * 1000;
  else if (/ GMT$/.test(text)) {
    const at = Date.parse(text);
    if (!Number.isNaN(at)) ms = Math.max(0, at - now);
  }
  return Math.min(BUSY_MAX_WAIT_MS, ms ?? backoff);
}

const MAX_REDIRECTS = 5;

export interface RegistryTransportOptions {
  readonly base: RegistryBase;
  /** The client's logger (`module: registry`). */
  readonly log: Logger;
  readonly credentials: readonly CredentialSource[];
  /** Socket inactivity that fails a request. */
  readonly idleTimeoutMs: number;
  /** Idle keep-alive sockets kept per host. */
  readonly maxIdleSockets: number;
  /** PEM certificates trusted besides Node's default CAs. */
  readonly ca: string | undefined;
}

/** The agents, the auth state and the request loop of one {@link RegistryClient}. */
export class RegistryTransport {
  readonly base: RegistryBase;
  /** `scheme://host`: what registry-relative paths resolve against. */
  readonly origin: string;
  readonly log: Logger;
  readonly #idleTimeoutMs: number;
  readonly #httpAgent: Http.Agent;
  readonly #httpsAgent: https.Agent;
  readonly #auth: RegistryAuthorization;
  readonly #ca: readonly string[] | undefined;
  /** Blob GETs go on connections of their own (bulk-get.ts), unless a proxy is configured. */
  readonly #bulk: boolean;
  /** The read buffers of blob GETs, reused once the pull hands their pieces back (slab-pool.ts). */
  readonly slabs = new SlabPool();

  constructor(opts: RegistryTransportOptions) {
    this.base = opts.base;
    this.origin = registryOrigin(this.base);
    this.log = opts.log;
    this.#idleTimeoutMs = opts.idleTimeoutMs;
    const maxFreeSockets = opts.maxIdleSockets;
    this.#httpAgent = new http.Agent({ keepAlive: true, maxFreeSockets });
    // Added to the default CAs (bundled, system and NODE_EXTRA_CA_CERTS), not in their place: a
    // token realm on a public host keeps working.
    const ca = opts.ca === undefined ? undefined : [...getCACertificates('default'), opts.ca];
    this.#httpsAgent = new https.Agent({ keepAlive: true, maxFreeSockets, ...(ca ? { ca } : {}) });
    this.#ca = ca;
    this.#bulk = !PROXY_VARIABLES.some((v) => process.env[v]);
    this.#auth = new RegistryAuthorization({
      base: this.base,
      credentials: opts.credentials,
      log: this.log,
      send: (url, method, headers, signal, body) => this.#send(url, method, headers, signal, body),
    });
  }

  /** Closes idle keep-alive sockets. */
  close(): void {
    this.#httpAgent.destroy();
    this.#httpsAgent.destroy();
  }

  /**
   * Sends one request with auth (anonymous or cached credentials first; one retry after a 401
   * challenge) and, when asked, redirects. The caller owns the response body.
   */
  async request(req: RegistryRequest): Promise<RegistryResponse> {
    const actions = req.actions ?? PULL;
    const url = new URL(req.path, this.origin);
    if (url.host !== this.base.host)
      throw new RegistryError('invalid', `request URL ${url.href} is not on the registry host`);
    const baseHeaders: Record<string, string> = { 'user-agent': `vk-cocoon/${VERSION}`, ...req.headers };
    let authorization = await this.#auth.authorization(req.repository, actions, req.signal);
    let res: RegistryResponse;
    let challenged = false;
    for (let busy = 0; ; ) {
      const headers = authorization ? { ...baseHeaders, authorization } : baseHeaders;
      res = await this.#send(url, req.method, headers, req.signal, req.body, req.bulk);
      if (BUSY_STATUS.has(res.statusCode ?? 0) && busy < BUSY_ATTEMPTS - 1) {
        // The registry asks to come back later: after its Retry-After (at most 30 s), else
        // 0.5, 1, 2 s. Every body is replayable (the 401 path sends it again too).
        const waitMs = busyWaitMs(res.headers['retry-after'], busy, Date.now());
        busy++;
        drain(res);
        this.log.info(
          { status: res.statusCode, path: url.pathname, waitMs, attempt: busy },
          'registry busy; retrying',
        );
        await sleep(waitMs, undefined, req.signal ? { signal: req.signal } : undefined);
        continue;
      }
      if (res.statusCode !== 401) break;
      const header = res.headers['www-authenticate'];
      if (challenged || header === undefined) {
        throw await statusError(res, `${req.method} ${url.pathname}`, 'auth');
      }
      drain(res);
      const challenges = parseWwwAuthenticate(header);
      const challenge =
        challenges.find((c) => c.scheme === 'bearer') ?? challenges.find((c) => c.scheme === 'basic');
      if (!challenge) {
        throw new RegistryError(
          'auth',
          `${req.method} ${url.pathname}: unsupported challenge ${JSON.stringify(header)}`,
          {
            status: 401,
          },
        );
      }
      challenged = true;
      this.#auth.challenged(challenge, req.repository, actions);
      authorization = await this.#auth.authorization(req.repository, actions, req.signal);
      if (!authorization) {
        throw new RegistryError(
          'auth',
          `${req.method} ${url.pathname}: registry ${this.base.host} requires credentials and none are configured`,
          {
            status: 401,
          },
        );
      }
    }
    if (!req.followRedirects) return res;
    let current = url;
    for (let hops = 0; REDIRECTS.has(res.statusCode ?? 0); hops++) {
      const location = res.headers.location;
      drain(res);
      if (location === undefined)
        throw new RegistryError('http', `${req.method} ${current.href}: redirect without Location`, {
          status: res.statusCode,
        });
      if (hops >= MAX_REDIRECTS)
        throw new RegistryError(
          'http',
          `${req.method} ${url.pathname}: more than ${MAX_REDIRECTS} redirects`,
        );
      const next = new URL(location, current);
      if (next.protocol !== 'https:' && next.protocol !== 'http:') {
        throw new RegistryError('http', `redirect to unsupported URL ${next.protocol}//${next.host}`);
      }
      if (next.protocol === 'http:' && this.base.scheme === 'https') {
        throw new RegistryError('http', `redirect from HTTPS to plain HTTP (${next.host}) refused`);
      }
      // Never forward credentials to another host (docs/registry.md "Transport and errors").
      const headers = { ...baseHeaders };
      if (next.host === this.base.host && authorization) headers.authorization = authorization;
      this.log.debug({ from: current.host, to: next.host, status: res.statusCode }, 'following redirect');
      current = next;
      res = await this.#send(
        next,
        req.method === 'HEAD' ? 'HEAD' : 'GET',
        headers,
        req.signal,
        undefined,
        req.bulk,
      );
    }
    return res;
  }

  /**
   * One HTTP/1.1 exchange; resolves with the response head. A {@link StreamBody} is piped with
   * backpressure (never buffered whole); a write method without a body sends
   * `Content-Length: 0` rather than chunked encoding.
   */
  #send(
    url: URL,
    method: string,
    headers: Readonly<Record<string, string>>,
    signal: AbortSignal | undefined,
    body: Buffer | StreamBody | undefined,
    bulk = false,
  ): Promise<RegistryResponse> {
    if (bulk && this.#bulk && method === 'GET' && body === undefined)
      return bulkGet({
        url,
        headers,
        ca: this.#ca,
        idleTimeoutMs: this.#idleTimeoutMs,
        pool: this.slabs,
        signal,
      });
    const what = `${method} ${url.host}${url.pathname}`;
    return new Promise((resolve, reject) => {
      if (signal?.aborted) {
        reject(networkError(what, signal.reason ?? new Error('aborted')));
        return;
      }
      const isHttps = url.protocol === 'https:';
      const length = body !== undefined ? body.length : method === 'GET' || method === 'HEAD' ? undefined : 0;
      const options: Http.RequestOptions = {
        method,
        headers: length === undefined ? headers : { ...headers, 'content-length': String(length) },
        agent: isHttps ? this.#httpsAgent : this.#httpAgent,
        signal,
      };
      const req = (isHttps ? https : http).request(url, options, resolve);
      req.setTimeout(this.#idleTimeoutMs, () => {
        req.destroy(new RegistryError('network', `${what}: no data for ${this.#idleTimeoutMs} ms`));
      });
      req.on('error', (error) => reject(networkError(what, error)));
      if (body === undefined || Buffer.isBuffer(body)) {
        req.end(body);
        return;
      }
      if ('file' in body) {
        writeFileRange(req, body.file, body.start, body.length).catch((error: Error) => req.destroy(error));
        return;
      }
      let source: Readable;
      try {
        source = body.open();
      } catch (error) {
        req.destroy(error as Error);
        return;
      }
      source.on('error', (error) => req.destroy(error));
      req.on('close', () => source.destroy());
      source.pipe(req);
    });
  }
}
