// The layer rule of docs/architecture.md holds for the whole of src/ (scripts/layers.ts).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LAYERS, violations } from '../../../scripts/layers.ts';

test('every import under src/ points down or sideways, and the framework never imports the provider', () => {
  assert.deepEqual(violations(), []);
});

test('the framework sits below the provider, the pure core below the framework', () => {
  for (const f of ['pods', 'kubelet', 'node']) assert.ok((LAYERS[f] ?? 0) < (LAYERS.provider ?? 0), f);
  for (const core of ['contract', 'guest', 'vmspec', 'lifecycle']) assert.ok((LAYERS[core] ?? 9) <= 3, core);
});
