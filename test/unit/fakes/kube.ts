// A fake Kubernetes client for in-process tests: a real `Kube` (real token buckets, write
// bounds, timeouts and retry policy) whose CoreV1Api is replaced by a recorder. Every call
// is recorded with its parameters, the AbortSignal it would hand to the HTTP request (from
// `withSignal`), the headers its call options set and the time it was made; a per-method
// handler decides the answer. Without a handler: create* echoes the body with a generated
// name, patch*/replace* answer the object's name with a new resourceVersion, delete*
// answers {}, list* answers an empty list, read* answers 404.
//
//   const { kube, core } = fakeKube({ qps: 5, burst: 5 });
//   core.on('patchNamespacedPodStatus', (params, call) => hangUntilAborted(call));
//   core.on('readNamespacedConfigMap', () => ({ data: { k: 'v' } }));
//   ...
//   assert.equal(core.callsOf('createNamespacedEvent').length, 1);
//
// Watches (the informers of src/kube/informer.ts) do not go through CoreV1Api: start a
// FakeWatchServer and point the fake at it (`fakeKube({ server: ws.url })`); the list comes
// from the fake core (e.g. `core.on('listPodForAllNamespaces', ...)`), watch streams stay
// open and `ws.emit(path, 'MODIFIED', obj)` pushes events into them.
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { CoreV1Api } from '../../../src/kube/api.ts';
import {
  ApiError,
  type CallOptions,
  type ClusterAccess,
  Kube,
  type KubeOptions,
} from '../../../src/kube/client.ts';

export interface FakeCall {
  method: string;
  // biome-ignore lint/suspicious/noExplicitAny: request parameter objects differ per method
  params: any;
  /** The signal the request would hand to the HTTP request (set by `withSignal`), if any. */
  signal: AbortSignal | undefined;
  /** Headers the call's options set (e.g. the patch Content-Type). */
  headers: Record<string, string>;
  /** performance.now() when the call was made. */
  at: number;
}

// biome-ignore lint/suspicious/noExplicitAny: handlers answer whatever the method returns
export type FakeHandler = (params: any, call: FakeCall) => unknown;

export class FakeCoreApi {
  readonly calls: FakeCall[] = [];
  readonly #handlers = new Map<string, FakeHandler>();
  #seq = 0;
  #rv = 1000;

  /** Sets the handler of one method (replacing an earlier one). */
  on(method: string, handler: FakeHandler): this {
    this.#handlers.set(method, handler);
    return this;
  }

  /** Recorded calls of one method, oldest first. */
  callsOf(method: string): FakeCall[] {
    return this.calls.filter((c) => c.method === method);
  }

  /** Resolves once `n` calls of `method` have been made (polls every 2 ms). */
  async waitForCalls(method: string, n = 1, timeoutMs = 5000): Promise<FakeCall[]> {
    const until = performance.now() + timeoutMs;
    for (;;) {
      const calls = this.callsOf(method);
      if (calls.length >= n) return calls;
      if (performance.now() > until) throw new Error(`${method}: ${calls.length} of ${n} calls`);
      await new Promise((r) => setImmediate(r));
    }
  }

  // biome-ignore lint/suspicious/noExplicitAny: see FakeHandler
  async invoke(method: string, params: any, options: CallOptions | undefined): Promise<unknown> {
    const call: FakeCall = {
      method,
      params,
      signal: options?.signal,
      headers: options?.contentType ? { 'Content-Type': options.contentType } : {},
      at: performance.now(),
    };
    this.calls.push(call);
    const handler = this.#handlers.get(method);
    if (handler) return await handler(params, call);
    return this.#default(method, params);
  }

  // biome-ignore lint/suspicious/noExplicitAny: see FakeHandler
  #default(method: string, params: any): unknown {
    const resourceVersion = String(++this.#rv);
    if (method.startsWith('create')) {
      const meta = params?.body?.metadata ?? {};
      const name = meta.name ?? `${meta.generateName ?? 'obj-'}${(++this.#seq).toString(36)}`;
      return {
        ...params?.body,
        metadata: { ...meta, name, namespace: params?.namespace ?? meta.namespace, resourceVersion },
      };
    }
    if (method.startsWith('patch') || method.startsWith('replace')) {
      return { metadata: { name: params?.name, namespace: params?.namespace, resourceVersion } };
    }
    if (method.startsWith('delete')) return {};
    if (method.startsWith('list')) return { items: [], metadata: { resourceVersion } };
    throw apiError(404, `${method}: not found (fake)`);
  }
}

/** An API error as the REST client throws it (apiStatus/apiErrorMessage read it). */
export function apiError(code: number, message = `HTTP ${code}`): ApiError {
  return new ApiError(code, { kind: 'Status', apiVersion: 'v1', status: 'Failure', message, code });
}

/** A request that never answers and ignores its signal (a black-holed connection whose
 * client cannot even abort). */
export function blackHole(): Promise<never> {
  return new Promise<never>(() => {});
}

/** A request that never answers but is aborted by its signal, as the HTTP request is. */
export function hangUntilAborted(call: FakeCall): Promise<never> {
  return new Promise<never>((_, reject) => {
    const s = call.signal;
    if (!s) return;
    if (s.aborted) reject(new DOMException('This operation was aborted', 'AbortError'));
    else
      s.addEventListener(
        'abort',
        () => reject(new DOMException('This operation was aborted', 'AbortError')),
        {
          once: true,
        },
      );
  });
}

/** Cluster access that points nowhere (port 9 on loopback), for clients that are never used. */
export function fakeKubeConfig(server = 'http://127.0.0.1:9'): ClusterAccess {
  return { server, insecureSkipTLSVerify: true, token: () => 'fake', source: 'fake' };
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED' | 'BOOKMARK' | 'ERROR';

export interface FakeWatchServer {
  /** Base URL to use as the cluster server. */
  url: string;
  /** Watch requests received (path and query), oldest first. */
  readonly requests: URL[];
  /** Open watch streams of `path` (e.g. `/api/v1/pods`), or of every path. */
  open(path?: string): number;
  /** Sends one watch event to every open watch of `path`. */
  emit(path: string, type: WatchEventType, object: unknown): void;
  /** Writes raw bytes (partial lines, garbage) to every open watch of `path`. */
  write(path: string, data: string | Buffer): void;
  /** Ends every open watch of `path` cleanly (the apiserver's watch timeout). */
  end(path: string): void;
  /** Answers the next watch request of `path` with `code` and a Status (e.g. 410 Gone). */
  rejectNext(path: string, code: number, message?: string): void;
  /** Resolves once `n` watches of `path` are open. */
  waitForWatch(path: string, n?: number, timeoutMs?: number): Promise<void>;
  close(): Promise<void>;
}

/** An HTTP server that only serves watches: every `?watch=true` GET gets a 200 and an open
 * stream of newline-delimited watch events (or the status `rejectNext` asked for); anything
 * else is a 404 Status. */
export async function startFakeWatchServer(): Promise<FakeWatchServer> {
  const streams = new Map<ServerResponse, string>();
  const requests: URL[] = [];
  const rejects = new Map<string, { code: number; message: string }[]>();
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://fake');
    if (req.method === 'GET' && url.searchParams.get('watch') === 'true') {
      requests.push(url);
      const reject = rejects.get(url.pathname)?.shift();
      if (reject) {
        res.writeHead(reject.code, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', ...reject }));
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.flushHeaders();
      streams.set(res, url.pathname);
      res.on('close', () => streams.delete(res));
      return;
    }
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', code: 404 }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const open = (path?: string) =>
    [...streams.values()].filter((p) => path === undefined || p === path).length;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    open,
    emit(path, type, object) {
      for (const [res, p] of streams) if (p === path) res.write(`${JSON.stringify({ type, object })}\n`);
    },
    write(path, data) {
      for (const [res, p] of streams) if (p === path) res.write(data);
    },
    end(path) {
      for (const [res, p] of streams) if (p === path) res.end();
    },
    rejectNext(path, code, message = `HTTP ${code}`) {
      const list = rejects.get(path) ?? [];
      list.push({ code, message });
      rejects.set(path, list);
    },
    async waitForWatch(path, n = 1, timeoutMs = 5000) {
      const until = performance.now() + timeoutMs;
      while (open(path) < n) {
        if (performance.now() > until) throw new Error(`${path}: ${open(path)} of ${n} watches open`);
        await new Promise((r) => setImmediate(r));
      }
    },
    async close() {
      for (const res of streams.keys()) res.destroy();
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

export interface FakeKubeOptions extends KubeOptions {
  /** Pod-write budget (default 1000/s, burst 1000: no throttling unless a test asks). */
  qps?: number;
  burst?: number;
  /** Cluster server of the kubeconfig (a FakeWatchServer's url); default: nowhere. */
  server?: string;
}

export interface FakeKube {
  kube: Kube;
  core: FakeCoreApi;
  /** API writes counted through `Kube.onWrite`. */
  writes(): number;
}

export function fakeKube(opts: FakeKubeOptions = {}): FakeKube {
  const kube = new Kube(fakeKubeConfig(opts.server), opts.qps ?? 1000, opts.burst ?? 1000, {
    eventQps: opts.eventQps ?? 1000,
    eventBurst: opts.eventBurst ?? 1000,
  });
  const core = new FakeCoreApi();
  const proxy = new Proxy(core, {
    get(target, prop, receiver) {
      if (typeof prop !== 'string' || prop in target) return Reflect.get(target, prop, receiver);
      if (prop === 'then') return undefined;
      // biome-ignore lint/suspicious/noExplicitAny: generic method stub
      return (params: any, options?: CallOptions) => target.invoke(prop, params, options);
    },
  });
  (kube as { core: CoreV1Api }).core = proxy as unknown as CoreV1Api;
  let writes = 0;
  kube.onWrite = () => {
    writes++;
  };
  return { kube, core, writes: () => writes };
}
