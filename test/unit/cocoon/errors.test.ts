import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import {
  classifyCocoonError,
  describeExit,
  formatJsonVerbError,
  formatPlainVerbError,
  isJsonVerb,
  isVmNotFound,
  snapshotHolder,
} from '../../../src/cocoon/errors.ts';

describe('classifyCocoonError (cocoon-cli.md §5)', () => {
  const rows: [string, string][] = [
    ['Error: vm not found: vk-a', 'vm_not_found'],
    ['Error: VM not found', 'vm_not_found'],
    ['Error: no such VM J7QX', 'vm_not_found'],
    ['Error: snapshot not found: acme', 'snapshot_not_found'],
    ['Error: No such snapshot', 'snapshot_not_found'],
    ['Error: image "x" not found in any backend', 'image_not_found'],
    ['Error: vm name "vk-a" already exists', 'vm_name_taken'],
    ['Error: snapshot name "vk-a" already exists', 'snapshot_name_taken'],
    ['Error: snapshot name "vk-a" already in use by D2M6QK7ZP4X3NWB5RT2YHCL7VA', 'snapshot_name_taken'],
    ['Error: snapshot D2M6 is in use by an active clone/restore/export', 'snapshot_leased'],
    [
      'exec: dial agent: connection refused (cocoon-agent may still be starting; retry shortly)',
      'agent_not_up',
    ],
    ['exec: "cocoon": executable file not found in $PATH', 'inconclusive'],
    ['Error: not found', 'inconclusive'],
    ['Error: database is locked', 'inconclusive'],
    ['context deadline exceeded', 'inconclusive'],
    ["invalid character 'x' looking for beginning of value", 'inconclusive'],
    ['', 'inconclusive'],
  ];
  for (const [text, expected] of rows) {
    it(`${JSON.stringify(text)} ⇒ ${expected}`, () => assert.equal(classifyCocoonError(text), expected));
  }

  it('generic "not found" is never promoted to vm gone', () => {
    assert.equal(isVmNotFound('executable file not found'), false);
    assert.equal(isVmNotFound('file not found'), false);
  });
});

describe('snapshotHolder', () => {
  it('extracts the holder ID after "already in use by"', () => {
    assert.equal(
      snapshotHolder('Error: snapshot name "vk-a" already in use by D2M6QK7ZP4X3NWB5RT2YHCL7VA'),
      'D2M6QK7ZP4X3NWB5RT2YHCL7VA',
    );
    assert.equal(
      snapshotHolder('already in use by "D2M6QK7ZP4X3NWB5RT2YHCL7VA".'),
      'D2M6QK7ZP4X3NWB5RT2YHCL7VA',
    );
  });

  it('falls back to the name of "snapshot name <n> already exists"', () => {
    assert.equal(snapshotHolder('Error: snapshot name "vk-a" already exists'), 'vk-a');
    assert.equal(snapshotHolder('Error: something else'), undefined);
  });
});

describe('error formatting (cocoon-cli.md §1)', () => {
  it('JSON verbs: exit status <N> (stderr: <trimmed>)', () => {
    assert.equal(
      formatJsonVerbError({ code: 1, signal: null }, '\nError: vm not found: x\n'),
      'exit status 1 (stderr: Error: vm not found: x)',
    );
  });

  it('plain verbs: (output: <text>)', () => {
    assert.equal(
      formatPlainVerbError({ code: 1, signal: null }, 'pulling...\nError: boom\n'),
      'exit status 1 (output: pulling...\nError: boom)',
    );
  });

  it('a killed child reads like Go: signal: killed', () => {
    assert.equal(describeExit({ code: null, signal: 'SIGKILL' }), 'signal: killed');
    assert.equal(describeExit({ code: null, signal: 'SIGUSR1' }), 'signal: SIGUSR1');
    assert.equal(describeExit({ code: 3, signal: null }), 'exit status 3');
  });

  it('knows the JSON verbs', () => {
    for (const argv of [
      ['vm', 'clone'],
      ['vm', 'run'],
      ['vm', 'inspect'],
      ['vm', 'list'],
      ['vm', 'reconcile-stale-create'],
      ['snapshot', 'inspect'],
      ['snapshot', 'list'],
      ['image', 'inspect'],
    ]) {
      assert.equal(isJsonVerb(argv), true, argv.join(' '));
    }
    for (const argv of [
      ['vm', 'rm'],
      ['vm', 'start'],
      ['vm', 'net'],
      ['snapshot', 'save'],
      ['snapshot', 'rm'],
      ['image', 'pull'],
    ]) {
      assert.equal(isJsonVerb(argv), false, argv.join(' '));
    }
  });
});
