// Authentication and authorization of the kubelet API (virtual-node.md §8; TS addition: the
// Go implementation accepts any TLS client). Client certificates verified against the
// client CA identify the apiserver; bearer tokens are checked with a TokenReview (cached
// 2 min); every request is authorized with a SubjectAccessReview on nodes/<subresource>
// (allow cached 5 min, deny 30 s).
import type { IncomingMessage } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { apiErrorMessage, type Kube } from '../kube/client.ts';

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

export class KubeletAuthorizer {
  readonly #kube: Kube;
  readonly #nodeName: string;
  readonly #tokens = new Map<string, Cached<UserInfo | null>>();
  readonly #decisions = new Map<string, Cached<{ allowed: boolean; reason: string }>>();

  constructor(kube: Kube, nodeName: string) {
    this.#kube = kube;
    this.#nodeName = nodeName;
  }

  async decide(req: IncomingMessage): Promise<AuthDecision> {
    let user: UserInfo | null;
    try {
      user = await this.#authenticate(req);
    } catch (err) {
      return { ok: false, status: 500, message: `authentication error: ${apiErrorMessage(err)}` };
    }
    if (!user) return { ok: false, status: 401, message: 'Unauthorized' };
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
