// Authentication and authorization of the kubelet API (docs/contracts/virtual-node.md "Authentication and authorization"; TS addition: the
// Go implementation accepts any TLS client). Client certificates verified against the
// client CA identify the apiserver; bearer tokens are checked with a TokenReview (cached
// 2 min); every request is authorized with a SubjectAccessReview on nodes/<subresource>
// (allow cached 5 min, deny 30 s). A request answered 401 whose client certificate did not
// verify against the client CA is logged once per (subject, issuer): the usual cause is an
// apiserver whose kubelet client certificate comes from another CA than the kubeconfig's.
import type { IncomingMessage } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { apiErrorMessage, type Kube } from '../kube/client.ts';
import type { Logger } from '../log.ts';
import { bundleSubjects, certificateNames } from './tls.ts';

export interface UserInfo {
  name: string;
  groups: string[];
  uid?: string;
  extra?: Record<string, string[]>;
}

export type AuthDecision =
  | { ok: true; user: UserInfo }
  | { ok: false; status: 401 | 403 | 500; message: string };

/** The SubjectAccessReview attributes of a kubelet API request (pure). */
export function requestAttributes(method: string, path: string): { verb: string; subresource: string } {
  const verb =
    (
      { GET: 'get', HEAD: 'get', POST: 'create', PUT: 'update', PATCH: 'patch', DELETE: 'delete' } as Record<
        string,
        string
      >
    )[method.toUpperCase()] ?? 'get';
  const first = path.split('/')[1] ?? '';
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
  readonly #tokens = new Map<string, Cached<UserInfo | null>>();
  readonly #decisions = new Map<string, Cached<{ allowed: boolean; reason: string }>>();
  readonly #reported = new Set<string>();

  constructor(kube: Kube, nodeName: string, opts: KubeletAuthorizerOptions = {}) {
    this.#kube = kube;
    this.#nodeName = nodeName;
    this.#log = opts.log?.child({ module: 'kubelet-auth' });
    this.#expectedCa = opts.clientCa ? bundleSubjects(opts.clientCa) : [];
  }

  async decide(req: IncomingMessage): Promise<AuthDecision> {
    let user: UserInfo | null;
    try {
      user = await this.#authenticate(req);
    } catch (err) {
      return { ok: false, status: 500, message: `authentication error: ${apiErrorMessage(err)}` };
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

  async #authenticate(req: IncomingMessage): Promise<UserInfo | null> {
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
    const token = m[1] as string;
    const now = Date.now();
    const hit = this.#tokens.get(token);
    if (hit && hit.until > now) return hit.value;
    const review = await this.#kube.authn.createTokenReview({
      body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token } },
    });
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
    if (this.#tokens.size > 10_000) this.#tokens.clear();
    this.#tokens.set(token, { value: user, until: now + 120_000 });
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
