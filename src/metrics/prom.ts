// prom-client's four classes the daemon uses, required from their own files rather than through
// the package's index: the index also loads the default process metrics (which require
// @opentelemetry/api, 52 modules), the Pushgateway (node:http, node:https, node:url), the
// cluster aggregator (node:cluster), Summary and the bucket generators, none of which the daemon
// uses, and they stayed in its memory for its whole life (docs/decisions.md "Daemon memory").
// Same classes, same module instances as `import from 'prom-client'` (the test suite's import
// of the package's global registry is this file's `Registry.globalRegistry`). The types are
// prom-client's own.
import { createRequire } from 'node:module';
import type * as Prom from 'prom-client';

const require = createRequire(import.meta.url);

export const Registry: typeof Prom.Registry = require('prom-client/lib/registry');
export const Counter: typeof Prom.Counter = require('prom-client/lib/counter');
export const Gauge: typeof Prom.Gauge = require('prom-client/lib/gauge');
export const Histogram: typeof Prom.Histogram = require('prom-client/lib/histogram');

export type Registry = Prom.Registry;
export type Counter<T extends string = string> = Prom.Counter<T>;
export type Gauge<T extends string = string> = Prom.Gauge<T>;
export type Histogram<T extends string = string> = Prom.Histogram<T>;
