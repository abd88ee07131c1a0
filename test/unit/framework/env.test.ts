import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { V1Pod } from '@kubernetes/client-node';
import { type EnvSources, expandVars, resolvePodEnv } from '../../../src/pods/env.ts';

function sources(
  cms: Record<string, Record<string, string>>,
  secrets: Record<string, Record<string, string>> = {},
  failing = new Set<string>(),
): EnvSources {
  return {
    configMap: async (_ns, name) => {
      if (failing.has(name)) throw new Error('etcd timeout');
      return cms[name] ?? null;
    },
    secret: async (_ns, name) => secrets[name] ?? null,
    serviceEnv: async () => ({ KUBERNETES_SERVICE_HOST: '10.0.0.1' }),
  };
}

function pod(container: Partial<NonNullable<V1Pod['spec']>['containers'][number]>): V1Pod {
  return {
    metadata: { name: 'p', namespace: 'ns', uid: 'u1', labels: { app: 'x' }, annotations: { a: 'b' } },
    spec: { nodeName: 'n1', containers: [{ name: 'agent', ...container }] },
  };
}

test('$(VAR) expansion follows kubelet rules', () => {
  const m = (n: string) => ({ A: 'x', B: 'y' })[n];
  assert.equal(expandVars('$(A)-$(B)', m), 'x-y');
  assert.equal(expandVars('$$(A)', m), '$(A)');
  assert.equal(expandVars('$(MISSING)', m), '$(MISSING)');
  assert.equal(expandVars('cost $5', m), 'cost $5');
});

test('envFrom, keyRefs, fieldRefs and expansion resolve', async () => {
  const r = await resolvePodEnv(
    pod({
      envFrom: [{ configMapRef: { name: 'cm' }, prefix: 'P_' }],
      env: [
        { name: 'FROM_CM', valueFrom: { configMapKeyRef: { name: 'cm', key: 'k' } } },
        { name: 'FROM_SECRET', valueFrom: { secretKeyRef: { name: 's', key: 'pw' } } },
        { name: 'NODE', valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } },
        { name: 'LABEL', valueFrom: { fieldRef: { fieldPath: "metadata.labels['app']" } } },
        { name: 'IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
        { name: 'MIX', value: '$(NODE)/$(P_k)' },
      ],
    }),
    sources({ cm: { k: 'v', 'bad key': 'z' } }, { s: { pw: 'hunter2' } }),
  );
  assert.deepEqual(r.blockedOn, []);
  const env = r.env.get('agent') ?? {};
  assert.equal(env.P_k, 'v');
  assert.equal(env.FROM_CM, 'v');
  assert.equal(env.FROM_SECRET, 'hunter2');
  assert.equal(env.NODE, 'n1');
  assert.equal(env.LABEL, 'x');
  assert.equal(env.IP, '', 'status.podIP resolves to empty instead of blocking');
  assert.equal(env.MIX, 'n1/v');
  assert.ok(
    r.events.some((e) => e.reason === 'InvalidEnvironmentVariableNames' && e.message.includes('P_bad key')),
  );
});

test('a missing mandatory ConfigMap blocks the pod with the standard event; optional ones only warn', async () => {
  const r = await resolvePodEnv(
    pod({
      env: [
        { name: 'A', valueFrom: { configMapKeyRef: { name: 'gone', key: 'k' } } },
        { name: 'B', valueFrom: { configMapKeyRef: { name: 'gone2', key: 'k', optional: true } } },
        { name: 'C', valueFrom: { secretKeyRef: { name: 's', key: 'nokey' } } },
      ],
    }),
    sources({}, { s: { other: '1' } }),
  );
  assert.deepEqual(
    r.events.map((e) => e.reason),
    ['MandatoryConfigMapNotFound', 'OptionalConfigMapNotFound', 'MandatorySecretKeyNotFound'],
  );
  assert.deepEqual(
    r.blockedOn.map((d) => `${d.kind}/${d.name}`),
    ['ConfigMap/gone', 'Secret/s'],
  );
  assert.equal(r.env.size, 0);
});

test('read errors are reported as FailedToRead* and block mandatory references', async () => {
  const r = await resolvePodEnv(
    pod({ envFrom: [{ configMapRef: { name: 'flaky' } }] }),
    sources({}, {}, new Set(['flaky'])),
  );
  assert.equal(r.events[0]?.reason, 'FailedToReadMandatoryConfigMap');
  assert.equal(r.blockedOn.length, 1);
});
