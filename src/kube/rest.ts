// The Kubernetes REST transport of the daemon: JSON over node:https / node:http with one
// keep-alive Agent, bearer-token / client-certificate / basic authentication from a
// ClusterAccess (src/kube/kubeconfig.ts), a per-request timeout and AbortSignal, and errors
// that carry the HTTP status and the apiserver's Status message (ApiError).
//
// Hand-written on purpose (docs/decisions.md "Kubernetes client"). The daemon's peak RSS
// budget is 100 MB under a 100-pod burst (issue 9); bare Node 24 is 41 MB, and
// `import('@kubernetes/client-node')` alone is 125 MB RSS (36 MB heap): its KubeConfig pulls
// every auth provider (azure, gcp, oidc/openid-client/jose, exec) and the generated
// ObjectSerializer with ~900 model classes (CoreV1Api alone: 88 MB), and every response is
// deserialized into model class instances (CPU per pod and per watch event). The daemon uses
// about twenty calls of it. Types still come from client-node, as `import type` only (erased
// at runtime); no runtime import of it is allowed under src/ (test/unit/shape/no-client-node).
// Responses are the apiserver's JSON as parsed: timestamps are strings, never Date.
import type { ClientRequest, Agent as HttpAgentType, IncomingMessage } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { createSecureContext } from 'node:tls';
import { DeadlineError } from '../util/deadline.ts';
import type { ClusterAccess } from './kubeconfig.ts';

// node:http is taken with process.getBuiltinModule, not an ES import: an ES import of a built-in
// builds its namespace from every export, and node:http's lazy getters (WebSocket, CloseEvent,
// MessageEvent of Node's bundled undici) then load undici and http2, ~75 modules, for the
// daemon's whole life (docs/decisions.md "Daemon memory"). No module of the daemon imports
// node:http as a value (test/unit/shape checks it); its types come from erased imports.
const { Agent: HttpAgent, request: httpRequest, STATUS_CODES } = process.getBuiltinModule('node:http');

/** Bound of one API request (not a watch stream) unless its caller's signal fires first. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 60_000;
/** Connections shared by the requests (not the watches) of one client: 16 kept a 1,000-pod
 * burst as fast as 32 did, with ~2 MiB less RSS (docs/decisions.md "Daemon memory"). */
export const MAX_REQUEST_SOCKETS = 16;
/** Largest response body of one request (a list of every pod of a big node is a few MB). */
export const MAX_RESPONSE_BYTES = 256 * 1024 * 1024;

export const CONTENT_TYPE_JSON = 'application/json';
export const CONTENT_TYPE_MERGE_PATCH = 'application/merge-patch+json';
export const CONTENT_TYPE_STRATEGIC_MERGE_PATCH = 'application/strategic-merge-patch+json';
export const CONTENT_TYPE_JSON_PATCH = 'application/json-patch+json';

/** The per-call options of every API method (the second argument): the request's abort
 * signal and, for patches, the patch content type. */
export interface CallOptions {
  signal?: AbortSignal;
  /** Content-Type of the body (patches: merge, strategic merge or JSON patch). */
  contentType?: string;
}

/** The apiserver's Status object (the body of every error answer). */
export interface ApiStatusBody {
  kind?: string;
  apiVersion?: string;
  status?: string;
  message?: string;
  reason?: string;
  code?: number;
  details?: unknown;
}

/** An API request the apiserver answered with a non-2xx status. `code` is the HTTP status,
 * `body` the Status object (or the raw text when the answer was not JSON). */
export class ApiError extends Error {
  override name = 'ApiError';
  readonly code: number;
  readonly body: ApiStatusBody | string;
  constructor(code: number, body: ApiStatusBody | string) {
    const msg = typeof body === 'string' ? body.trim().slice(0, 300) : body.message;
    super(`HTTP ${code}${msg ? `: ${msg}` : ''}`);
    this.code = code;
    this.body = body;
  }

  /** The Status reason (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `Expired`, …). */
  get reason(): string | undefined {
    return typeof this.body === 'string' ? undefined : this.body.reason;
  }
}

export type QueryValue = string | number | boolean | undefined | null;

export interface RequestSpec {
  method: 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';
  /** Path below the server URL, e.g. `/api/v1/namespaces/ns/pods/p/status`. */
  path: string;
  query?: Readonly<Record<string, QueryValue>>;
  /** JSON body (serialized with JSON.stringify: Dates become ISO strings). */
  body?: unknown;
  contentType?: string;
  signal?: AbortSignal;
  /** Default DEFAULT_REQUEST_TIMEOUT_MS. */
  timeoutMs?: number;
}

export interface RestClientOptions {
  timeoutMs?: number;
  userAgent?: string;
}

/** A reused keep-alive socket the server had already closed: the request never reached it. */
function staleSocket(req: ClientRequest, err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException | null)?.code;
  return req.reusedSocket && (code === 'ECONNRESET' || code === 'EPIPE');
}

function parseBody(code: number, text: string): ApiStatusBody | string {
  try {
    const v = JSON.parse(text) as unknown;
    if (typeof v === 'object' && v !== null) return v as ApiStatusBody;
  } catch {
    // not JSON (a proxy's HTML page, an empty body)
  }
  return text.trim() || STATUS_CODES[code] || '';
}

export class RestClient {
  readonly access: ClusterAccess;
  readonly #base: URL;
  readonly #https: boolean;
  readonly #agent: HttpAgentType;
  readonly #watchAgent: HttpAgentType;
  readonly #timeoutMs: number;
  readonly #userAgent: string;

  constructor(access: ClusterAccess, opts: RestClientOptions = {}) {
    this.access = access;
    this.#base = new URL(access.server);
    this.#https = this.#base.protocol === 'https:';
    this.#timeoutMs = opts.timeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
    this.#userAgent = opts.userAgent ?? 'vk-cocoon';
    // Keep-alive: writes reuse connections. Idle sockets are closed after 60 s, before the
    // apiserver's own 90 s idle timeout could race a request onto a closing socket (a request
    // that still meets one is retried once, see `request`).
    // Requests share at most MAX_REQUEST_SOCKETS connections (more wait in the agent, in the
    // order they were sent), all kept while idle: a burst of 100 writes otherwise opened ~100
    // TLS connections at once and re-opened them as they were freed, each a handshake and its
    // buffers (100-pod bench: 118 connections). Watches hold their connection for minutes, so
    // they have an agent of their own and never take a request's place. One TLS context
    // serves every connection (tls.connect would otherwise parse the CA and key each time).
    const tlsOpts = this.#https
      ? {
          secureContext: createSecureContext({ ca: access.ca, cert: access.cert, key: access.key }),
          rejectUnauthorized: !access.insecureSkipTLSVerify,
          servername: access.tlsServerName,
        }
      : {};
    const agentOpts = { keepAlive: true, keepAliveMsecs: 30_000, timeout: 60_000, ...tlsOpts };
    const requestOpts = {
      ...agentOpts,
      maxSockets: MAX_REQUEST_SOCKETS,
      maxFreeSockets: MAX_REQUEST_SOCKETS,
    };
    const watchOpts = { ...agentOpts, maxFreeSockets: 4 };
    this.#agent = this.#https ? new HttpsAgent(requestOpts) : new HttpAgent(requestOpts);
    this.#watchAgent = this.#https ? new HttpsAgent(watchOpts) : new HttpAgent(watchOpts);
  }

  /** The URL of `path` with `query` (undefined and null values left out). */
  url(path: string, query?: Readonly<Record<string, QueryValue>>): URL {
    const base = this.#base.pathname.replace(/\/+$/, '');
    const url = new URL(`${base}${path}`, this.#base);
    for (const [k, v] of Object.entries(query ?? {}))
      if (v !== undefined && v !== null) url.searchParams.set(k, String(v));
    return url;
  }

  #headers(): Record<string, string> {
    const h: Record<string, string> = { Accept: CONTENT_TYPE_JSON, 'User-Agent': this.#userAgent };
    const token = this.access.token?.();
    if (token) h.Authorization = `Bearer ${token}`;
    else if (this.access.basicAuth) {
      const { username, password } = this.access.basicAuth;
      h.Authorization = `Basic ${Buffer.from(`${username}:${password}`).toString('base64')}`;
    }
    return h;
  }

  /** One API request; resolves with the parsed JSON answer, rejects with ApiError for a
   * non-2xx answer, DeadlineError at the timeout, the signal's AbortError when aborted, or
   * the transport error. A request that met a stale keep-alive socket is sent once more. */
  async request<T>(spec: RequestSpec): Promise<T> {
    const payload = spec.body === undefined ? undefined : Buffer.from(JSON.stringify(spec.body));
    try {
      return await this.#once<T>(spec, payload);
    } catch (err) {
      if (!(err instanceof StaleSocket)) throw err;
      try {
        return await this.#once<T>(spec, payload);
      } catch (again) {
        throw again instanceof StaleSocket ? again.cause : again;
      }
    }
  }

  #once<T>(spec: RequestSpec, payload: Buffer | undefined): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const headers = this.#headers();
      if (payload) {
        headers['Content-Type'] = spec.contentType ?? CONTENT_TYPE_JSON;
        headers['Content-Length'] = String(payload.length);
      }
      const timeoutMs = spec.timeoutMs ?? this.#timeoutMs;
      let responded = false;
      const req = (this.#https ? httpsRequest : httpRequest)(this.url(spec.path, spec.query), {
        method: spec.method,
        headers,
        agent: this.#agent,
        signal: spec.signal,
      });
      const timer = setTimeout(() => req.destroy(new DeadlineError('API request', timeoutMs)), timeoutMs);
      const fail = (err: unknown) => {
        clearTimeout(timer);
        reject(!responded && staleSocket(req, err) ? new StaleSocket(err) : err);
      };
      req.on('error', fail);
      req.on('response', (res) => {
        responded = true;
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size > MAX_RESPONSE_BYTES) {
            req.destroy(
              new Error(`API response of ${spec.method} ${spec.path} exceeds ${MAX_RESPONSE_BYTES} bytes`),
            );
            return;
          }
          chunks.push(c);
        });
        res.on('error', fail);
        // A connection that closes before the answer is complete (settles nothing if it was).
        res.on('close', () => {
          if (!res.complete) fail(new Error(`API answer of ${spec.method} ${spec.path} was cut off`));
        });
        res.on('end', () => {
          clearTimeout(timer);
          const code = res.statusCode ?? 0;
          const text = Buffer.concat(chunks).toString('utf8');
          if (code < 200 || code >= 300) {
            reject(new ApiError(code, parseBody(code, text)));
            return;
          }
          if (text.length === 0) {
            resolve(undefined as T);
            return;
          }
          try {
            resolve(JSON.parse(text) as T);
          } catch {
            reject(new Error(`API answer of ${spec.method} ${spec.path} is not JSON`));
          }
        });
      });
      req.end(payload);
    });
  }

  /**
   * Opens a watch stream: resolves with the response once the apiserver answered 200 (the
   * caller reads newline-delimited watch events from it and destroys it to stop), rejects
   * with ApiError for any other status (e.g. 410 Gone: the resourceVersion is too old),
   * DeadlineError when no answer came within the request timeout, or the transport error.
   */
  watch(
    path: string,
    query: Readonly<Record<string, QueryValue>>,
    signal?: AbortSignal,
  ): Promise<IncomingMessage> {
    return new Promise<IncomingMessage>((resolve, reject) => {
      const timeoutMs = this.#timeoutMs;
      const req = (this.#https ? httpsRequest : httpRequest)(this.url(path, { ...query, watch: true }), {
        method: 'GET',
        headers: this.#headers(),
        agent: this.#watchAgent,
        signal,
      });
      const timer = setTimeout(
        () => req.destroy(new DeadlineError('API watch request', timeoutMs)),
        timeoutMs,
      );
      let answered = false;
      // However the request ends (an answer, an error, an abort before the socket was even
      // assigned), the deadline timer goes with it (left behind it would hold the process), and
      // the promise is settled: closed without an answer is a failure (a no-op after an error).
      req.on('close', () => {
        clearTimeout(timer);
        if (!answered) reject(new Error('API watch request closed before an answer'));
      });
      req.on('error', (err) => {
        clearTimeout(timer);
        reject(err);
      });
      req.on('response', (res) => {
        answered = true;
        clearTimeout(timer);
        const code = res.statusCode ?? 0;
        if (code === 200) {
          resolve(res);
          return;
        }
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size <= 1 << 20) chunks.push(c);
        });
        res.on('error', reject);
        res.on('end', () =>
          reject(new ApiError(code, parseBody(code, Buffer.concat(chunks).toString('utf8')))),
        );
      });
      req.end();
    });
  }

  /** Destroys every socket of the client (shutdown, tests); later requests open new ones. */
  close(): void {
    this.#agent.destroy();
    this.#watchAgent.destroy();
  }
}

class StaleSocket extends Error {
  constructor(cause: unknown) {
    super('stale keep-alive socket', { cause });
  }
}
