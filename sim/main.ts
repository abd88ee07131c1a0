// Entry point of the cocoon CLI simulator (docs/simulator.md), run by bin/cocoon-sim with
// COCOON_SIM_ARGV0 telling whether it was invoked as `cocoon` or as `cocoon-sim`.
// Startup cost matters (the provider may spawn hundreds of invocations per second), so this
// file only turns on Node's compile cache, then loads the dispatcher; every verb module is
// imported on demand. Setting NODE_COMPILE_CACHE in the environment (sim/client.ts does)
// also spares this file's own TypeScript transform.
import module from 'node:module';
import os from 'node:os';
import path from 'node:path';

if (!process.env.NODE_COMPILE_CACHE) {
  module.enableCompileCache?.(path.join(os.tmpdir(), 'cocoon-sim-node-cache'));
}
const { main } = await import('./run.ts');
await main();
