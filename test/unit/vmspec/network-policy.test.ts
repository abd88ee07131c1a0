// The network allow-list (vmspec/network-policy.ts): the syntax of VK_ALLOWED_NETWORKS and
// VK_NAMESPACE_NETWORKS, their startup validation, and which rule governs which namespace.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { loadConfig } from '../../../src/config/env.ts';
import { networkRefusal, parseNetworkPolicy } from '../../../src/vmspec/network-policy.ts';

describe('parsing', () => {
  it('unset and empty keep the open policy', () => {
    for (const [a, n] of [
      [undefined, undefined],
      ['', ''],
      ['  ', ' ; '],
    ] as const) {
      const { policy, problems } = parseNetworkPolicy(a, n);
      assert.deepEqual(problems, []);
      assert.equal(policy.allowed, undefined);
      assert.equal(policy.perNamespace.size, 0);
    }
  });

  it('reads the node list and the namespace lists, including an empty one', () => {
    const { policy, problems } = parseNetworkPolicy(
      'cocoon-dhcp, lab ,lab',
      ' ns-a=net1|net2 ; ns-b = net3;ns-c=',
    );
    assert.deepEqual(problems, []);
    assert.deepEqual(policy.allowed, ['cocoon-dhcp', 'lab']);
    assert.deepEqual(
      [...policy.perNamespace],
      [
        ['ns-a', ['net1', 'net2']],
        ['ns-b', ['net3']],
        ['ns-c', []],
      ],
    );
  });

  it('names each bad entry and the variable', () => {
    const { problems } = parseNetworkPolicy('ok,-bad,a b', 'ns-a;NS=x;ns-b=n/1;ns-c=x;ns-c=y');
    assert.deepEqual(problems, [
      'VK_ALLOWED_NETWORKS: "-bad" is not a network name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)',
      'VK_ALLOWED_NETWORKS: "a b" is not a network name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)',
      `VK_NAMESPACE_NETWORKS: entry "ns-a" has no '=': expected <namespace>=<network>[|<network>...], entries separated by ';'`,
      'VK_NAMESPACE_NETWORKS: "NS" is not a namespace name',
      'VK_NAMESPACE_NETWORKS: ns-b: "n/1" is not a network name ([a-zA-Z0-9][a-zA-Z0-9_.-]*)',
      'VK_NAMESPACE_NETWORKS: namespace ns-c is listed twice',
    ]);
  });

  it('a bad value stops startup with the variable named', () => {
    assert.throws(
      () => loadConfig({ VK_NAMESPACE_NETWORKS: 'ns-a:net1' }),
      /invalid configuration:\n {2}VK_NAMESPACE_NETWORKS: entry "ns-a:net1" has no '='/,
    );
    const c = loadConfig({ VK_ALLOWED_NETWORKS: 'n1', VK_NAMESPACE_NETWORKS: 'ns-a=n2' });
    assert.deepEqual(c.networkPolicy.allowed, ['n1']);
    assert.deepEqual(c.networkPolicy.perNamespace.get('ns-a'), ['n2']);
  });
});

describe('networkRefusal', () => {
  const policy = parseNetworkPolicy('shared', 'ns-a=net-a|lab;ns-c=').policy;

  it('the open policy allows every network', () => {
    assert.equal(networkRefusal(parseNetworkPolicy('', '').policy, 'any', 'mgmt'), undefined);
  });

  it('the default network (no annotation) is always allowed', () => {
    for (const ns of ['ns-a', 'ns-c', 'other']) assert.equal(networkRefusal(policy, ns, ''), undefined);
  });

  it('an unlisted namespace is held to the node list', () => {
    assert.equal(networkRefusal(policy, 'other', 'shared'), undefined);
    assert.equal(
      networkRefusal(policy, 'other', 'net-a'),
      'network "net-a" refused: VK_ALLOWED_NETWORKS limits pods of this node to shared (leave cocoonset.cocoonstack.io/network unset for the default network)',
    );
  });

  it('a listed namespace is held to its own list, which replaces the node list', () => {
    assert.equal(networkRefusal(policy, 'ns-a', 'lab'), undefined);
    assert.match(
      networkRefusal(policy, 'ns-a', 'shared') ?? '',
      /^network "shared" refused: VK_NAMESPACE_NETWORKS limits namespace ns-a to net-a, lab /,
    );
    assert.match(
      networkRefusal(policy, 'ns-c', 'shared') ?? '',
      /VK_NAMESPACE_NETWORKS limits namespace ns-c to no network but the default one/,
    );
  });

  it('a namespace list without a node list leaves other namespaces open', () => {
    const only = parseNetworkPolicy(undefined, 'ns-a=net-a').policy;
    assert.equal(networkRefusal(only, 'other', 'mgmt'), undefined);
    assert.notEqual(networkRefusal(only, 'ns-a', 'mgmt'), undefined);
  });
});
