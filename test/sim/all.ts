// `node --test test/sim/` resolves this directory through package.json "main" and runs this
// file: every contract test of the simulator (every `*.test.ts` beside it, so none can be left
// out), two suites at a time (most of their wall time is spent waiting on lease delays and
// tickers). `node --test test/sim/*.test.ts` works as well.
import { readdirSync } from 'node:fs';
import { describe } from 'node:test';

const files = readdirSync(import.meta.dirname)
  .filter((f) => f.endsWith('.test.ts'))
  .sort();

describe('cocoon simulator', { concurrency: 2 }, async () => {
  for (const f of files) await import(`./${f}`);
});
