// The CRC-32C addon (a native module, ~3.4 MB of resident memory) is loaded on the first
// checksum, not when the peer modules are imported: a node that never serves or fetches a
// slice never pays for it (docs/decisions.md "Daemon memory").
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { test } from 'node:test';
import { pathToFileURL } from 'node:url';

test('importing the peer library loads no CRC addon; the first checksum does', () => {
  const wire = pathToFileURL(new URL('../../../src/peer/wire.ts', import.meta.url).pathname).href;
  const server = pathToFileURL(new URL('../../../src/peer/server.ts', import.meta.url).pathname).href;
  const script = `
    import { createRequire } from 'node:module';
    const cache = createRequire(import.meta.url).cache;
    const loaded = () => Object.keys(cache).some((k) => k.includes('crc32'));
    const { crc32cUpdate, crc32cHex } = await import(${JSON.stringify(wire)});
    await import(${JSON.stringify(server)});
    const before = loaded();
    const sum = crc32cHex(crc32cUpdate(0, Buffer.from('123456789')));
    console.log(JSON.stringify({ before, after: loaded(), sum }));
  `;
  const out = execFileSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8' });
  const r = JSON.parse(out.trim()) as { before: boolean; after: boolean; sum: string };
  assert.equal(r.before, false, 'not loaded by the imports');
  assert.equal(r.after, true, 'loaded by the first checksum');
  assert.equal(r.sum, 'e3069283', 'CRC-32C of "123456789" (the check value)');
});
