// Authentication and authorization of the kubelet API (docs/contracts/virtual-node.md "Authentication and authorization"; TS addition: the
// Go implementation accepts any TLS client). Client certificates verified against the
// client CA identify the apiserver; bearer tokens are checked with a TokenReview, and what is
// remembered about them, and how often a source may fail, is bounded in ./authn-limits.ts
// (accepted 2 min, rejected 1 min, by a hash of the token; 20 failures per source, then one
// per 3 s); every request is authorized with a SubjectAccessReview on nodes/<subresource>
// (allow cached 5 min, deny 30 s). A request answered 401 whose client certificate did not
// verify against the client CA is logged once per (subject, issuer): the usual cause is an
// apiserver whose kubelet client certificate comes from another CA than the kubeconfig's.
import type { IncomingMessage } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { apiErrorMessage, type Kube } from '../kube/client.ts';
import type { Logger } from '../log.ts';
import {
  ACCEPTED_TOKEN_TTL_MS,
  ExpiringLru,
  FailedAuthLimiter,
  REJECTED_TOKEN_TTL_MS,
  sourceKey,
  TOKEN_TABLE_ENTRIES,
  tokenKey,
} from './authn-limits.ts';
import { bundleSubjects, certificateNames } from './tls.ts';

export interface UserInfo {
  name: string;
  groups: string[];
  uid?: string;
  extra?: Record<string, string[]>;
}

export type AuthDecision =
  | { ok: true; user: UserInfo }
  | { ok: false; status: 401 | 403 | 429 | 500; message: string; retryAfterSeconds?: number };

/**
 * The paths that run something in a VM or open a stream into it. Their verb is `create`
 * whatever the method: a WebSocket exec is an HTTP GET, and authorizing it as `get` let
 * anyone with read access to nodes/proxy (monitoring, dashboards) exec into every VM.
 * Upstream kubelets close the same hole by requiring `create` for these paths (their
 * WebSocket hardening); we do the same, for every method.
 */
export const STREAMING_PATHS: ReadonlySet<string> = new Set(['exec', 'attach', 'portForward', 'run']);

const METHOD_VERBS: Readonly<Record<string, string>> = {
  GET: 'get',
  HEAD: 'get',
  POST: 'create',
  PUT: 'update',
  PATCH: 'patch',
  DELETE: 'delete',
};

/** The SubjectAccessReview attributes of a kubelet API request (pure). */
export function requestAttributes(method: string, path: string): { verb: string; subresource: string } {
  const first = path.split('/')[1] ?? '';
  const verb = STREAMING_PATHS.has(first) ? 'create' : (METHOD_VERBS[method.toUpperCase()] ?? 'get');
  const subresource =
    first === 'stats' ? 'stats' : first === 'metrics' ? 'metrics' : first === 'logs' ? 'log' : 'proxy';
  return { verb, subresource };
}

interface Cached<T> {
  value: T;
  until: number;
}

export interface KubeletAuthorizerOptions {
  /** The PEM bundle the TLS server verifies client certificates against (undefined: none). */
  clientCa?: string;
  /** Receives the once-per-(subject, issuer) line about a rejected client certificate. */
  log?: Logger;
  /** Called once per TokenReview sent, with its outcome (the daemon counts them in a metric). */
  onTokenReview?: (result: TokenReviewResult) => void;
  /** Called when a source's failed-authentication budget refused a request. */
  onThrottled?: () => void;
  /** The failed-authentication limiter (tests size it; the daemon uses the defaults). */
  limiter?: FailedAuthLimiter;
}

export type TokenReviewResult = 'authenticated' | 'rejected' | 'error';

interface Throttled {
  throttled: true;
  retryAfterMs: number;
}

export const CLIENT_CERT_REJECTED =
  'kubelet API client certificate does not verify against the client CA: 401';
const CLIENT_CA_HINT =
  'the apiserver presents --kubelet-client-certificate to kubelets; set VK_TLS_CLIENT_CA to the CA bundle that signed it (default: the kubeconfig cluster CA)';
const MAX_REPORTED = 1000;

export class KubeletAuthorizer {
  readonly #kube: Kube;
  readonly #nodeName: string;
  readonly #log: Logger | undefined;
  readonly #expectedCa: string[];
  readonly #opts: KubeletAuthorizerOptions;
  readonly #accepted = new ExpiringLru<UserInfo>(TOKEN_TABLE_ENTRIES);
  readonly #rejected = new ExpiringLru<true>(TOKEN_TABLE_ENTRIES);
  /** Reviews in flight by token hash: concurrent requests with one token share one review. */
  readonly #inflight = new Map<string, Promise<UserInfo | null>>();
  readonly #limiter: FailedAuthLimiter;
  readonly #decisions = new Map<string, Cached<{ allowed: boolean; reason: string }>>();
  readonly #reported = new Set<string>();

  constructor(kube: Kube, nodeName: string, opts: KubeletAuthorizerOptions = {}) {
    this.#kube = kube;
    this.#nodeName = nodeName;
    this.#log = opts.log?.child({ module: 'kubelet-auth' });
    this.#expectedCa = opts.clientCa ? bundleSubjects(opts.clientCa) : [];
    this.#opts = opts;
    this.#limiter = opts.limiter ?? new FailedAuthLimiter();
  }

  async decide(req: IncomingMessage): Promise<AuthDecision> {
    let user: UserInfo | null | Throttled;
    try {
      user = await this.#authenticate(req);
    } catch (err) {
      return { ok: false, status: 500, message: `authentication error: ${apiErrorMessage(err)}` };
    }
    if (user && 'throttled' in user) {
      const retryAfterSeconds = Math.max(1, Math.ceil(user.retryAfterMs / 1000));
      return {
        ok: false,
        status: 429,
        message: `Too many failed authentications from this source; retry in ${retryAfterSeconds} s`,
        retryAfterSeconds,
      };
    }
    if (!user) {
      this.#reportRejectedCertificate(req.socket as TLSSocket);
      return { ok: false, status: 401, message: 'Unauthorized' };
    }
    const path = new URL(req.url ?? '/', 'https://x').pathname;
    const { verb, subresource } = requestAttributes(req.method ?? 'GET', path);
    try {
      const d = await this.#authorize(user, verb, subresource);
      if (!d.allowed) {
        return {
          ok: false,
          status: 403,
          message: `Forbidden (user=${user.name}, verb=${verb}, resource=nodes, subresource=${subresource})${d.reason ? `: ${d.reason}` : ''}`,
        };
      }
    } catch (err) {
      return { ok: false, status: 500, message: `authorization error: ${apiErrorMessage(err)}` };
    }
    return { ok: true, user };
  }

  /** Logs, once per (subject, issuer), a client certificate that was presented but did not
   * verify, with the CA subjects it was checked against. */
  #reportRejectedCertificate(socket: TLSSocket): void {
    if (!this.#log || socket.authorized || typeof socket.getPeerCertificate !== 'function') return;
    const peer = socket.getPeerCertificate();
    if (!peer?.raw) return;
    const names = certificateNames(peer.raw) ?? { subject: '(unparseable)', issuer: '(unparseable)' };
    const key = `${names.subject}\0${names.issuer}`;
    if (this.#reported.has(key)) return;
    if (this.#reported.size >= MAX_REPORTED) this.#reported.clear();
    this.#reported.add(key);
    this.#log.warn(
      {
        subject: names.subject,
        issuer: names.issuer,
        reason: String(socket.authorizationError ?? 'unverified'),
        expectedCa: this.#expectedCa.length > 0 ? this.#expectedCa : ['(none configured)'],
        hint: CLIENT_CA_HINT,
      },
      CLIENT_CERT_REJECTED,
    );
  }

  async #authenticate(req: IncomingMessage): Promise<UserInfo | null | Throttled> {
    const socket = req.socket as TLSSocket;
    if (socket.authorized) {
      const cert = socket.getPeerCertificate();
      const cn = cert?.subject?.CN;
      if (cn) {
        const o = cert.subject.O as string | string[] | undefined;
        const name = Array.isArray(cn) ? (cn[0] as string) : cn;
        return { name, groups: o === undefined ? [] : Array.isArray(o) ? o : [o] };
      }
    }
    const header = req.headers.authorization ?? '';
    const m = /^Bearer\s+(\S+)$/i.exec(header);
    if (!m) return null;
    const key = tokenKey(m[1] as string);
    const now = Date.now();
    const accepted = this.#accepted.get(key, now);
    if (accepted) return accepted;
    // Known bad: answered without asking the apiserver and without charging the source.
    if (this.#rejected.get(key, now)) return null;
    const pending = this.#inflight.get(key);
    if (pending) return await pending;
    const source = sourceKey(req.socket.remoteAddress);
    const charge = this.#limiter.take(source, now);
    if (!charge.ok) {
      this.#opts.onThrottled?.();
      if (charge.firstRefusal)
        this.#log?.warn(
          { source, retryAfterMs: charge.retryAfterMs },
          'kubelet API: too many failed authentications from one source; answering 429 without a TokenReview',
        );
      return { throttled: true, retryAfterMs: charge.retryAfterMs };
    }
    const review = this.#review(m[1] as string, key, source);
    this.#inflight.set(key, review);
    try {
      return await review;
    } finally {
      this.#inflight.delete(key);
    }
  }

  /** One TokenReview; its charge to `source` is refunded when the token is valid. */
  async #review(token: string, key: string, source: string): Promise<UserInfo | null> {
    let review: Awaited<ReturnType<Kube['authn']['createTokenReview']>>;
    try {
      review = await this.#kube.authn.createTokenReview({
        body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token } },
      });
    } catch (err) {
      // The charge stays: a failing apiserver is not asked faster by a failing client.
      this.#opts.onTokenReview?.('error');
      throw err;
    }
    const st = review.status;
    const user: UserInfo | null =
      st?.authenticated && st.user?.username
        ? {
            name: st.user.username,
            groups: st.user.groups ?? [],
            uid: st.user.uid,
            extra: st.user.extra as Record<string, string[]> | undefined,
          }
        : null;
    const now = Date.now();
    if (user) {
      this.#limiter.refund(source, now);
      this.#accepted.set(key, user, now + ACCEPTED_TOKEN_TTL_MS);
    } else {
      this.#rejected.set(key, true, now + REJECTED_TOKEN_TTL_MS);
    }
    this.#opts.onTokenReview?.(user ? 'authenticated' : 'rejected');
    return user;
  }

  async #authorize(
    user: UserInfo,
    verb: string,
    subresource: string,
  ): Promise<{ allowed: boolean; reason: string }> {
    const key = `${user.name}\0${user.groups.join(',')}\0${verb}\0${subresource}`;
    const now = Date.now();
    const hit = this.#decisions.get(key);
    if (hit && hit.until > now) return hit.value;
    const sar = await this.#kube.authz.createSubjectAccessReview({
      body: {
        apiVersion: 'authorization.k8s.io/v1',
        kind: 'SubjectAccessReview',
        spec: {
          user: user.name,
          groups: user.groups,
          uid: user.uid,
          extra: user.extra,
          resourceAttributes: { verb, resource: 'nodes', name: this.#nodeName, group: '', subresource },
        },
      },
    });
    const value = { allowed: sar.status?.allowed === true, reason: sar.status?.reason ?? '' };
    if (this.#decisions.size > 10_000) this.#decisions.clear();
    this.#decisions.set(key, { value, until: now + (value.allowed ? 300_000 : 30_000) });
    return value;
  }
}
