// `node --test test/sim/` resolves this directory through package.json "main" and runs this
// file: every contract test of the simulator, two suites at a time (most of their wall time is
// spent waiting on lease delays and tickers). `node --test test/sim/*.test.ts` works as well.
import { describe } from 'node:test';

describe('cocoon simulator', { concurrency: 2 }, async () => {
  await import('./events.test.ts');
  await import('./cli-contract.test.ts');
  await import('./lifecycle.test.ts');
  await import('./guest-dhcp.test.ts');
  await import('./concurrency.test.ts');
  await import('./faults-snapshots.test.ts');
  await import('./disk-content.test.ts');
  await import('./server.test.ts');
});
