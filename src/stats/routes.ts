// Kubelet API routes for stats (docs/contracts/virtual-node.md "Routes"), mounted by src/kubelet/server.ts through
// its `extraRoutes` option (which also handles authn/authz, GET-only and errors).
import type { IncomingMessage, ServerResponse } from 'node:http';
import { buildResourceMetrics, RESOURCE_METRICS_CONTENT_TYPE } from './resource-metrics.ts';
import { buildSummary } from './summary.ts';
import type { Sample } from './types.ts';

export type RouteHandler = (req: IncomingMessage, res: ServerResponse) => Promise<void>;

export function statsRoutes(
  sampler: { sample(): Promise<Sample> },
  nodeName: string,
  startTime: Date,
): Record<string, RouteHandler> {
  const send = (res: ServerResponse, contentType: string, body: string): void => {
    res.writeHead(200, { 'content-type': contentType, 'content-length': Buffer.byteLength(body) });
    res.end(body);
  };
  const summary: RouteHandler = async (_req, res) => {
    send(res, 'application/json', JSON.stringify(buildSummary(await sampler.sample(), nodeName, startTime)));
  };
  const resource: RouteHandler = async (_req, res) => {
    send(res, RESOURCE_METRICS_CONTENT_TYPE, buildResourceMetrics(await sampler.sample()));
  };
  // The trailing-slash forms are what some clients ask for (the kubelet answers both).
  return {
    '/stats/summary': summary,
    '/stats/summary/': summary,
    '/metrics/resource': resource,
    '/metrics/resource/': resource,
  };
}
