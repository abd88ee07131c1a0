// The pure half of `vk-cocoon explain`: facts in, the report's JSON out, for every kind the
// issue names (ready, failed by exhaustion with a hint, failed on the IP wait, still creating,
// invalid annotations, hibernated) and the others (create backoff, evicted, not found, a node
// whose daemon is down).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ExplainReport } from '../../../src/cli/explain/facts.ts';
import { renderJson, renderText } from '../../../src/cli/explain/render.ts';
import { explain } from '../../../src/cli/explain/report.ts';
import { ann, created, event, facts, MAC, NOW, NS, pod, SCRIPT, VM_ID, vmRecord } from './fixtures.ts';

/** The report as a script reads it: the JSON, parsed. */
const json = (f: Parameters<typeof explain>[0]): ExplainReport => JSON.parse(renderJson(explain(f)));

const RECREATE = `Recreate the pod through its controller: \`kubectl delete pod -n ${NS} db-0\` (its ReplicaSet db-0-rs creates a new one, which gets a new VM and a new attempt)`;

test('ready: the decoded spec, the triple, the step, the VM record, nothing to do', () => {
  const p = pod(
    'web-0',
    ann('vk-web-0', {
      'vm.cocoonstack.io/id': VM_ID,
      'vm.cocoonstack.io/ip': '172.20.0.9',
      'vm.cocoonstack.io/lifecycle-state': 'ready',
      'vm.cocoonstack.io/lifecycle-observed-generation': '3',
    }),
    {
      podIP: '172.20.0.9',
      ready: true,
      readiness: { status: 'True', reason: 'Ready', message: 'lifecycle ready' },
    },
  );
  const r = json(facts(p, [created], { vm: { status: 'found', ref: VM_ID, record: vmRecord('vk-web-0') } }));
  assert.equal(r.kind, 'ready');
  assert.equal(r.headline, 'ready: the VM is up with IP 172.20.0.9 and the pod is Ready');
  assert.deepEqual(r.pod, {
    namespace: NS,
    name: 'web-0',
    found: true,
    uid: 'uid-web-0',
    node: 'cocoon-pool',
    phase: 'Running',
    ready: true,
    podIP: '172.20.0.9',
    deleting: false,
    controller: 'ReplicaSet web-0-rs',
  });
  assert.equal(r.spec.ok, true);
  assert.deepEqual(
    {
      vmName: r.spec.decoded?.vmName,
      image: r.spec.decoded?.image,
      mode: r.spec.decoded?.mode,
      os: r.spec.decoded?.os,
      backend: r.spec.decoded?.backend,
      managed: r.spec.decoded?.managed,
      generation: r.spec.decoded?.generation,
      probePort: r.spec.decoded?.probePort,
    },
    {
      vmName: 'vk-web-0',
      image: 'acme/agent',
      mode: 'clone',
      os: 'linux',
      backend: 'cloud-hypervisor',
      managed: true,
      generation: '3',
      probePort: null,
    },
  );
  assert.deepEqual(r.lifecycle, { state: 'ready', observedGeneration: '3', message: null, generation: '3' });
  assert.deepEqual(r.step, {
    reason: 'Ready',
    status: 'True',
    message: 'lifecycle ready',
    since: '2026-03-01T12:00:01Z',
    deadline: null,
    deadlinePassed: null,
    nextRetry: null,
    givesUpAt: null,
    phaseDeadlines: [],
  });
  assert.deepEqual(r.vm, {
    id: VM_ID,
    ip: '172.20.0.9',
    inspect: {
      status: 'found',
      ref: VM_ID,
      record: {
        id: VM_ID,
        name: 'vk-web-0',
        state: 'running',
        hypervisor: 'cloud-hypervisor',
        pid: 4242,
        image: 'acme/agent',
        nics: [{ mac: MAC, tap: 'tap0', static: null }],
      },
    },
    savedState: null,
  });
  assert.equal(r.failure, null);
  assert.deepEqual(r.events, [
    {
      type: 'Normal',
      reason: 'ProviderCreateSuccess',
      count: 1,
      firstTime: '2026-03-01T12:00:00Z',
      lastTime: '2026-03-01T12:00:00Z',
      message: 'Create pod in provider successfully',
    },
  ]);
  assert.deepEqual(r.recovery, {
    meaning: 'the VM is up with IP 172.20.0.9 and the pod is Ready',
    steps: ['Nothing to do'],
  });
});

const exhaustedErrors = [1, 2, 3].map((n) => `attempt ${n}: exit status 1 (output: Error: boom)`);

function exhausted() {
  return pod(
    'db-0',
    ann('vk-db-0', {
      'vm.cocoonstack.io/id': VM_ID,
      'vm.cocoonstack.io/lifecycle-state': 'failed',
      'vm.cocoonstack.io/lifecycle-observed-generation': '3',
      'vm.cocoonstack.io/lifecycle-state-message': exhaustedErrors.join('\n'),
      'vm.cocoonstack.io/post-clone-state': 'failed',
      'vm.cocoonstack.io/post-clone-hint': Buffer.from(SCRIPT).toString('base64'),
      'vm.cocoonstack.io/post-clone-errors': exhaustedErrors.join('\n'),
    }),
    { readiness: { reason: 'Failed', message: exhaustedErrors.join('\n') } },
  );
}

test('failed by exhaustion: the decoded hint, the command to run it, every attempt error, recreate', () => {
  const events = [
    created,
    event('PostCloneExecAttemptFailed', exhaustedErrors[2] ?? '', { count: 3, at: '2026-03-01T12:03:00Z' }),
    event('PostCloneExecExhausted', `create: ${exhaustedErrors.join('\n')}`, { at: '2026-03-01T12:03:01Z' }),
  ];
  const r = json(
    facts(exhausted(), events, { vm: { status: 'found', ref: VM_ID, record: vmRecord('vk-db-0') } }),
  );
  assert.equal(r.kind, 'failed');
  assert.deepEqual(r.failure, {
    reason: 'PostCloneExecExhausted',
    message: exhaustedErrors.join('\n'),
    source: 'event',
  });
  assert.deepEqual(r.postClone, {
    state: 'failed',
    hint: SCRIPT,
    hintCommand: `cocoon vm exec ${VM_ID} -- sh -c '${SCRIPT.replaceAll("'", `'\\''`)}'`,
    hintError: null,
    errors: exhaustedErrors,
    failedAttempts: 3,
  });
  assert.match(
    r.headline,
    /^failed \(PostCloneExecExhausted\): the guest network fixup failed for its whole budget \(180 s unless VK_FIXUP_BUDGET_SECONDS\)/,
  );
  assert.deepEqual(r.recovery.steps, [
    `Optional, to restore connectivity now: run the hint in the guest from the host: \`cocoon vm exec ${VM_ID} -- sh -c "$(kubectl get pod -n ${NS} db-0 -o jsonpath='{.metadata.annotations.vm\\.cocoonstack\\.io/post-clone-hint}' | base64 -d)"\`; this neither clears failed nor makes the pod Ready`,
    'Read the attempt errors: fix their cause in the guest image or the network (the guest agent never came up, a missing systemd-networkd or cloud-init, a read-only /etc)',
    RECREATE,
    `Its VM ${VM_ID} stays until the pod is deleted (failed is sticky: no retry in place)`,
  ]);
});

test('failed by exhaustion without its events (expired): the reason is inferred from the post-clone keys', () => {
  const r = json(facts(exhausted(), []));
  assert.deepEqual(r.failure, {
    reason: 'PostCloneExecExhausted',
    message: exhaustedErrors.join('\n'),
    source: 'inferred',
  });
  assert.equal(r.postClone.hint, SCRIPT);
  assert.equal(r.postClone.failedAttempts, 0);
});

test('a Windows hint is a whole command line: run as it is', () => {
  const hint =
    "powershell -nop -c '$x=Get-PnpDevice -Class Net -PresentOnly;$x|Disable-PnpDevice -Confirm:$false;$x|Enable-PnpDevice -Confirm:$false'";
  const p = exhausted();
  p.metadata!.annotations!['vm.cocoonstack.io/post-clone-hint'] = Buffer.from(hint).toString('base64');
  const r = json(facts(p, []));
  assert.equal(r.postClone.hintCommand, `cocoon vm exec ${VM_ID} -- ${hint}`);
  assert.match(r.recovery.steps[0] ?? '', /cocoon vm exec \S+ -- <the hint below>/);
});

test('a hint that is not base64 is reported, not guessed', () => {
  const p = exhausted();
  p.metadata!.annotations!['vm.cocoonstack.io/post-clone-hint'] = 'not base64!';
  const r = json(facts(p, []));
  assert.equal(r.postClone.hint, null);
  assert.equal(
    r.postClone.hintError,
    'vm.cocoonstack.io/post-clone-hint is not standard base64 of UTF-8 text',
  );
});

test('failed on the IP wait: PostCloneIPWaitTimeout, the lease file for NIC 0 MAC, recreate', () => {
  const message = 'clone vk-db-0: dhcp lease not observed within 45s';
  const p = pod(
    'db-0',
    ann('vk-db-0', {
      'vm.cocoonstack.io/id': VM_ID,
      'vm.cocoonstack.io/lifecycle-state': 'failed',
      'vm.cocoonstack.io/lifecycle-observed-generation': '3',
      'vm.cocoonstack.io/lifecycle-state-message': message,
    }),
    { readiness: { reason: 'Failed', message } },
  );
  const r = json(
    facts(p, [created, event('PostCloneIPWaitTimeout', `create: ${message}`)], {
      vm: { status: 'found', ref: VM_ID, record: vmRecord('vk-db-0') },
    }),
  );
  assert.equal(r.kind, 'failed');
  assert.deepEqual(r.failure, { reason: 'PostCloneIPWaitTimeout', message, source: 'event' });
  assert.deepEqual(r.recovery, {
    meaning: "no DHCP lease for NIC 0's MAC was observed within 45 s after the clone (and its fixup)",
    steps: [
      `Check cocoon-net on the host (\`systemctl status cocoon-net\`) and its lease file (VK_LEASES_PATH, default /var/lib/cocoon/net/leases.json) for NIC 0's MAC ${MAC}: no row, or an expired one, means the guest never got a DHCP answer`,
      RECREATE,
      `Its VM ${VM_ID} stays until the pod is deleted (failed is sticky: no retry in place)`,
    ],
  });
  // Without events (expired) the message alone names it; after a wake it is WakeIPWaitTimeout.
  assert.equal(json(facts(p, [])).failure?.reason, 'PostCloneIPWaitTimeout');
  p.metadata!.annotations!['vm.cocoonstack.io/lifecycle-state-message'] = message.replace('clone', 'wake');
  assert.equal(json(facts(p, [])).failure?.reason, 'WakeIPWaitTimeout');
});

test('still creating: the step, its ready deadline and what ends it', () => {
  const p = pod(
    'db-0',
    ann('vk-db-0', {
      'vm.cocoonstack.io/id': VM_ID,
      'vm.cocoonstack.io/lifecycle-state': 'creating',
      'vm.cocoonstack.io/lifecycle-observed-generation': '3',
      'vm.cocoonstack.io/post-clone-state': 'running',
    }),
    {
      readiness: {
        reason: 'PostCloneFixup',
        message: 'step PostCloneFixup; ready deadline 2026-03-01T12:19:00.000Z',
      },
    },
  );
  const r = json(facts(p, [created, event('PostCloneExecAttemptFailed', 'attempt 2: agent', { count: 2 })]));
  assert.equal(r.kind, 'creating');
  assert.deepEqual(r.step, {
    reason: 'PostCloneFixup',
    status: 'False',
    message: 'step PostCloneFixup; ready deadline 2026-03-01T12:19:00.000Z',
    since: '2026-03-01T12:00:01Z',
    deadline: '2026-03-01T12:19:00.000Z',
    deadlinePassed: false,
    nextRetry: null,
    givesUpAt: null,
    phaseDeadlines: [],
  });
  assert.equal(
    r.headline,
    'creating: running the guest network fixup (cocoon vm exec, an attempt every 3 s within its budget, 180 s unless VK_FIXUP_BUDGET_SECONDS); exhausted, the pod is failed (PostCloneExecExhausted) with a hint',
  );
  assert.deepEqual(r.recovery.steps, [
    '2 failed fixup attempt(s) so far (the events show the last error)',
    'Decided by the ready deadline at the latest, 2026-03-01T12:19:00.000Z (in 9m00s): ready, or failed with the reason of the step',
  ]);
  assert.equal(r.failure, null);
});

test('still creating, no VM yet, then a create backoff with its next retry and give-up time', () => {
  const a = ann('vk-db-0', { 'vm.cocoonstack.io/lifecycle-state': 'creating' });
  const bringingUp = json(facts(pod('db-0', a, { phase: 'Pending' }), [created]));
  assert.equal(bringingUp.kind, 'creating');
  assert.equal(bringingUp.step, null);
  assert.match(bringingUp.headline, /^creating: the VM is being brought up and is not bound yet/);
  const backoff = pod('db-0', a, {
    phase: 'Pending',
    readiness: {
      reason: 'CreateBackoff',
      message:
        'step CreateBackoff; attempt 2 failed: cocoon vm clone: deadline exceeded; next retry 2026-03-01T12:10:20.000Z; gives up at 2026-03-01T12:19:40.000Z',
    },
  });
  const r = json(facts(backoff, [created]));
  assert.equal(r.step?.nextRetry, '2026-03-01T12:10:20.000Z');
  assert.equal(r.step?.givesUpAt, '2026-03-01T12:19:40.000Z');
  assert.deepEqual(r.recovery.steps, [
    'Next retry 2026-03-01T12:10:20.000Z (in 20s)',
    'Gives up (failed, "gave up after <n> attempts") 2026-03-01T12:19:40.000Z (in 9m40s) unless an attempt succeeds',
    'Fix what the error names (cocoon on the host, the registry); nothing else to do while it retries',
  ]);
});

test('invalid annotations: every decode error with its key, and which key to fix', () => {
  const message =
    'invalid VM annotations: cocoonset.cocoonstack.io/mode: expected clone, run or static (case-insensitive), got "teleport"; unsupported backend "qemu"';
  const p = pod(
    'bad-0',
    ann('vk-bad', {
      'cocoonset.cocoonstack.io/mode': 'teleport',
      'vm.cocoonstack.io/backend': 'qemu',
      'vm.cocoonstack.io/lifecycle-state': 'failed',
      'vm.cocoonstack.io/lifecycle-observed-generation': '3',
      'vm.cocoonstack.io/lifecycle-state-message': message,
    }),
    { phase: 'Pending' },
  );
  const r = json(
    facts(p, [event('CreateBringUpFailed', `create: ${message}`)], {
      vm: { status: 'absent', ref: 'vk-bad' },
    }),
  );
  assert.equal(r.kind, 'invalid-annotations');
  assert.deepEqual(r.spec, {
    ok: false,
    errors: [
      {
        key: 'cocoonset.cocoonstack.io/mode',
        message:
          'cocoonset.cocoonstack.io/mode: expected clone, run or static (case-insensitive), got "teleport"',
      },
      { key: 'vm.cocoonstack.io/backend', message: 'unsupported backend "qemu"' },
    ],
    warnings: [],
    decoded: null,
  });
  assert.deepEqual(r.failure, { reason: 'CreateBringUpFailed', message, source: 'event' });
  assert.equal(
    r.headline,
    'invalid annotations: the VMSpec annotations do not decode (cocoonset.cocoonstack.io/mode, vm.cocoonstack.io/backend): the pod never gets a VM',
  );
  assert.deepEqual(r.recovery.steps, [
    'Fix cocoonset.cocoonstack.io/mode: expected clone, run or static (case-insensitive), got "teleport"',
    'Fix vm.cocoonstack.io/backend: unsupported backend "qemu"',
    "Fix them in the pod's controller template (a new pod gets them), or on this pod with `kubectl annotate --overwrite`: a changed annotation runs a new create attempt at once",
  ]);
});

test('hibernated: where the state is, how to wake, what a delete removes', () => {
  const p = pod(
    'db-0',
    ann('vk-db-0', {
      'vm.cocoonstack.io/hibernate': 'true',
      'vm.cocoonstack.io/lifecycle-state': 'hibernated',
      'vm.cocoonstack.io/lifecycle-observed-generation': '3',
    }),
    {
      phase: 'Pending',
      readiness: {
        reason: 'Hibernated',
        message: 'lifecycle hibernated: the VM is removed and its state saved',
      },
    },
  );
  const events = [
    created,
    event('Hibernated', 'saved locally (no registry pusher configured)', { type: 'Normal' }),
  ];
  const r = json(
    facts(p, events, {
      vm: { status: 'absent', ref: 'vk-db-0' },
      savedState: { status: 'found', name: 'vk-db-0', id: 'snap-1' },
    }),
  );
  assert.equal(r.kind, 'hibernated');
  assert.equal(r.spec.decoded?.hibernate, true);
  assert.deepEqual(r.vm, {
    id: null,
    ip: null,
    inspect: { status: 'absent', ref: 'vk-db-0' },
    savedState: { status: 'found', name: 'vk-db-0', id: 'snap-1' },
  });
  assert.deepEqual(r.recovery, {
    meaning: 'the VM is removed and its state is saved in the local snapshot vk-db-0',
    steps: [
      `To wake it: \`kubectl annotate pod -n ${NS} db-0 vm.cocoonstack.io/hibernate-\` (the pod goes creating, step Waking, then ready from the saved state)`,
      'Deleting the pod also removes the local snapshot vk-db-0 unless vm.cocoonstack.io/keep-snapshot-on-delete is "true"; registry tags are the operator\'s to delete',
    ],
  });
  const pushed = json(facts(p, [event('Hibernated', 'snapshot pushed to registry', { type: 'Normal' })]));
  assert.equal(
    pushed.recovery.meaning,
    'the VM is removed and its state is saved in vk-db-0:hibernate in the registry',
  );
});

test('hibernating: every phase deadline; how to cancel', () => {
  const p = pod(
    'db-0',
    ann('vk-db-0', {
      'vm.cocoonstack.io/hibernate': 'true',
      'vm.cocoonstack.io/lifecycle-state': 'hibernating',
    }),
    {
      readiness: {
        reason: 'Hibernating',
        message:
          'step Hibernating (snapshot); deadlines: snapshot by 2026-03-01T12:15:00.000Z, remove by 2026-03-01T12:16:30.000Z',
      },
    },
  );
  const r = json(facts(p, []));
  assert.equal(r.kind, 'hibernating');
  assert.deepEqual(r.step?.phaseDeadlines, [
    { phase: 'snapshot', by: '2026-03-01T12:15:00.000Z' },
    { phase: 'remove', by: '2026-03-01T12:16:30.000Z' },
  ]);
  assert.equal(r.recovery.steps[0], 'Phase snapshot by 2026-03-01T12:15:00.000Z (in 5m00s)');
});

test('evicted: a pod deleted after its VM died is explained from its events', () => {
  const events = [event('Evicted', 'VMGone: VM vk-db-0 (GA7I) is gone')];
  const r = json(facts(undefined, events));
  assert.equal(r.kind, 'evicted');
  assert.equal(r.pod.found, false);
  assert.match(r.headline, /^evicted \(VMGone: VM vk-db-0 \(GA7I\) is gone\): the VM died for good/);
  assert.equal(json(facts(undefined, [])).kind, 'not-found');
});

test('the node is NotReady: the report says the daemon is down before anything else', () => {
  const p = exhausted();
  const r = json(
    facts(p, [], {
      node: {
        name: 'cocoon-pool',
        ready: 'Unknown',
        since: '2026-03-01T12:05:00Z',
        message: 'Kubelet stopped posting node status.',
      },
    }),
  );
  assert.match(
    r.recovery.steps[0] ?? '',
    /^Node cocoon-pool is NotReady \(Ready=Unknown\) since 2026-03-01T12:05:00Z: its vk-cocoon daemon is not running/,
  );
  assert.equal(r.failure?.reason, 'PostCloneExecExhausted');
});

test('the text screen: one screen, the hint verbatim, long lists cut', () => {
  const errors = Array.from({ length: 60 }, (_, i) => `attempt ${i + 1}: boom`);
  const p = exhausted();
  p.metadata!.annotations!['vm.cocoonstack.io/post-clone-errors'] = errors.join('\n');
  p.metadata!.annotations!['vm.cocoonstack.io/lifecycle-state-message'] = errors.join('\n');
  const text = renderText(explain(facts(p, [created])), NOW);
  const lines = text.trimEnd().split('\n');
  assert.ok(lines.length <= 40, `${lines.length} lines`);
  const hint = SCRIPT.split('\n');
  const long = lines.filter((l) => l.length > 120 && !hint.includes(l.trim()) && !/`.{100,}`/.test(l));
  assert.deepEqual(long, [], 'at most 120 columns but the hint and a command');
  for (const line of SCRIPT.split('\n')) assert.ok(lines.includes(`             ${line}`), line);
  assert.ok(text.includes('… 56 more (-o json lists them all)'));
  assert.ok(text.includes('message: the 60 post-clone errors (below)'));
  assert.equal(lines[0], `vk-cocoon explain ${NS}/db-0`);
});

test('the last wake: its source from the Woken event (peer, registry or the verified local copy)', () => {
  const p = pod(
    'web-1',
    ann('vk-web-1', {
      'vm.cocoonstack.io/id': VM_ID,
      'vm.cocoonstack.io/lifecycle-state': 'ready',
    }),
    { ready: true, readiness: { status: 'True', reason: 'Ready', message: 'lifecycle ready' } },
  );
  const woken = (message: string, at: string) => event('Woken', message, { type: 'Normal', at });
  const peer = explain(
    facts(p, [
      created,
      woken('cloned from vk-web-1:hibernate', '2026-03-01T12:00:05Z'),
      woken('cloned from peer host-b', '2026-03-01T12:00:09Z'),
    ]),
  );
  assert.deepEqual(peer.wake, { source: 'peer', from: 'host-b', at: '2026-03-01T12:00:09Z' });
  assert.match(renderText(peer, NOW), /Last wake\s+peer restore from node host-b at 2026-03-01T12:00:09Z/);
  assert.deepEqual(
    explain(facts(p, [created, woken('cloned from vk-web-1:hibernate', '2026-03-01T12:00:05Z')])).wake,
    {
      source: 'registry',
      from: 'vk-web-1:hibernate',
      at: '2026-03-01T12:00:05Z',
    },
  );
  assert.equal(
    explain(facts(p, [created, woken('cloned from vk-web-1', '2026-03-01T12:00:05Z')])).wake?.source,
    'local',
  );
  const none = explain(facts(p, [created]));
  assert.equal(none.wake, null);
  assert.doesNotMatch(renderText(none, NOW), /Last wake/);
});

test('a deleted pod whose delete-time push waits for the registry: the Deferred line and what to do', () => {
  const events = [
    event(
      'SnapshotPushDeferred',
      'delete: vk-db-0:latest push deferred (push vk-db-0:latest: connect ECONNREFUSED); the state is kept as local snapshot vk-db-0 and pushed when the registry takes it',
    ),
  ];
  const deferred = {
    status: 'read' as const,
    pushes: [
      {
        repo: 'vk-db-0',
        tag: 'latest',
        savedAt: '2026-03-01T12:00:01.000Z',
        attempts: 2,
        lastError: 'push vk-db-0:latest: connect ECONNREFUSED',
        lastAttemptAt: '2026-03-01T12:00:20.000Z',
      },
    ],
  };
  const f = facts(undefined, events, { name: 'db-0', deferred });
  const r = json(f);
  assert.equal(r.kind, 'not-found');
  assert.match(r.headline, /its delete-time snapshot vk-db-0:latest waits for the registry$/);
  assert.equal(r.deferredPushes[0]?.attempts, 2);
  assert.match(r.recovery.steps[0] ?? '', /never remove the local snapshot by hand/);
  const text = renderText(explain(f), NOW);
  assert.match(
    text,
    /\nDeferred {3}vk-db-0:latest waits for the registry: saved 12:00:01, 2 failed tries; last error: push vk-db-0:latest:\n {11}connect ECONNREFUSED\n/,
  );
  // An unreadable ledger is said, never silently left out.
  const denied = renderText(
    explain(facts(undefined, [], { deferred: { status: 'error', error: 'EACCES: permission denied' } })),
    NOW,
  );
  assert.match(denied, /Deferred {3}\(the ledger could not be read: EACCES: permission denied\)/);
  assert.equal(json(facts(undefined, [])).deferredPushes.length, 0);
  // For a live pod the unreadable ledger is not news (explain as a non-root user on the node).
  const live = pod('web-1', ann('vk-web-1', { 'vm.cocoonstack.io/lifecycle-state': 'creating' }));
  const quiet = renderText(explain(facts(live, [], { deferred: { status: 'error', error: 'EACCES' } })), NOW);
  assert.doesNotMatch(quiet, /Deferred/);
});
