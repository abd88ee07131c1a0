// The informer's transform (src/kube/informer.ts): applied to listed and watched objects
// before they are cached or handed to callbacks; Kube.informer strips managedFields.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Kube } from '../../../src/kube/client.ts';
import { Informer, type KubeObject, stripManagedFields } from '../../../src/kube/informer.ts';
import { RestClient } from '../../../src/kube/rest.ts';
import { fakeKubeConfig, startFakeWatchServer } from '../fakes/kube.ts';

const PATH = '/api/v1/pods';

interface Obj extends KubeObject {
  metadata?: KubeObject['metadata'] & { managedFields?: unknown[]; labels?: Record<string, string> };
  data?: string;
}

function obj(name: string, rv: string): Obj {
  return {
    metadata: {
      namespace: 'ns',
      name,
      resourceVersion: rv,
      labels: { app: name },
      managedFields: [{ manager: 'kubectl', operation: 'Update', fieldsV1: { 'f:metadata': {} } }],
    },
    data: name,
  };
}

async function until(what: string, check: () => boolean, timeoutMs = 5000): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!check()) {
    if (performance.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 2));
  }
}

test('stripManagedFields drops metadata.managedFields and keeps everything else', () => {
  const o = obj('a', '1');
  const out = stripManagedFields(o);
  assert.equal(out, o);
  assert.deepEqual(out, {
    metadata: { namespace: 'ns', name: 'a', resourceVersion: '1', labels: { app: 'a' } },
    data: 'a',
  });
  assert.deepEqual(stripManagedFields({}), {});
});

test('the transform applies to listed and watched objects, before the cache and the callbacks', async (t) => {
  const ws = await startFakeWatchServer();
  const rest = new RestClient(fakeKubeConfig(ws.url));
  const seen: Obj[] = [];
  const informer = new Informer<Obj>({
    rest,
    path: PATH,
    list: async () => ({ items: [obj('a', '5')], metadata: { resourceVersion: '10' } }),
    transform: stripManagedFields,
  });
  for (const verb of ['add', 'update', 'delete'] as const) informer.on(verb, (o) => seen.push(o));
  t.after(async () => {
    await informer.stop();
    rest.close();
    await ws.close();
  });
  await informer.start();
  await ws.waitForWatch(PATH);
  ws.emit(PATH, 'ADDED', obj('b', '11'));
  ws.emit(PATH, 'MODIFIED', obj('a', '12'));
  ws.emit(PATH, 'DELETED', obj('b', '13'));
  ws.emit(PATH, 'BOOKMARK', { metadata: { resourceVersion: '20' } });
  await until('events', () => seen.length === 4);
  await until('bookmark', () => informer.latestResourceVersion() === '20');
  for (const o of [...seen, ...informer.list()]) {
    assert.equal(o.metadata?.managedFields, undefined);
    assert.equal(o.data, o.metadata?.name);
  }
  assert.deepEqual(
    seen.map((o) => `${o.metadata?.name}@${o.metadata?.resourceVersion}`),
    ['a@5', 'b@11', 'a@12', 'b@13'],
  );
});

test('Kube.informer caches objects without managedFields', async (t) => {
  const ws = await startFakeWatchServer();
  const kube = new Kube(new RestClient(fakeKubeConfig(ws.url)));
  const informer = kube.informer<Obj>(PATH, async () => ({
    items: [obj('a', '5')],
    metadata: { resourceVersion: '10' },
  }));
  t.after(async () => {
    await informer.stop();
    kube.rest.close();
    await ws.close();
  });
  await informer.start();
  assert.equal(informer.get('a', 'ns')?.metadata?.managedFields, undefined);
  assert.equal(informer.get('a', 'ns')?.metadata?.labels?.app, 'a');
});
