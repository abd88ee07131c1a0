// The kubelet API's own Prometheus families (docs/metrics.md "Kubelet API"; TS addition):
// what the failed-authentication bounds and the connection cap did, so an operator sees a
// token flood or a connection flood without reading logs. Registered on the daemon's
// registry by src/main.ts, like the other families that live beside their feeder.
import { Counter, type Registry } from '../metrics/prom.ts';
import type { TokenReviewResult } from './auth.ts';

export interface KubeletMetrics {
  /** One per TokenReview the daemon sent, by outcome. */
  tokenReviews: { inc(labels: { result: TokenReviewResult }): void };
  /** Requests answered 429 by the per-source failed-authentication limit (no TokenReview). */
  authThrottled: { inc(): void };
  /** Connections closed at once because VK_KUBELET_MAX_CONNECTIONS were open. */
  connectionsDropped: { inc(): void };
}

export function kubeletMetrics(registry: Registry): KubeletMetrics {
  const registers = [registry];
  return {
    tokenReviews: new Counter({
      name: 'cocoon_vk_kubelet_token_reviews_total',
      help: 'TokenReviews sent for bearer tokens presented to the kubelet API, by result (authenticated, rejected, error).',
      labelNames: ['result'],
      registers,
    }),
    authThrottled: new Counter({
      name: 'cocoon_vk_kubelet_auth_throttled_total',
      help: 'Kubelet API requests answered 429 by the per-source limit on failed authentications.',
      registers,
    }),
    connectionsDropped: new Counter({
      name: 'cocoon_vk_kubelet_connections_dropped_total',
      help: 'Kubelet API connections closed because VK_KUBELET_MAX_CONNECTIONS were open.',
      registers,
    }),
  };
}
