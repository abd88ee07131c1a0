// The VM event stream's line reader and decoder (docs/contracts/cocoon-cli.md "Event line"):
// lines split across chunks, lines over the bound dropped whole, undecodable lines skipped.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { LineSplitter, parseEventLine } from '../../../src/cocoon/events.ts';

const VM = {
  id: 'J7QX4MZK2N5VBR3TLWD6YHPC2E',
  hypervisor: 'cloud-hypervisor',
  state: 'stopped (stale)',
  config: { name: 'vk-a-0', cpu: 2, memory: 2147483648 },
  pid: 48213,
  network_configs: [{ tap: 'tap0', mac: '02:4e:9a:11:c3:7d', num_queues: 4, queue_size: 0 }],
};

describe('LineSplitter', () => {
  test('joins a line split across chunks and keeps the rest for the next chunk', () => {
    const s = new LineSplitter(64);
    assert.deepEqual(s.push(Buffer.from('ab')).lines, []);
    assert.deepEqual(s.push(Buffer.from('c\nde')).lines, ['abc']);
    assert.deepEqual(s.push(Buffer.from('f\n\ng\n')).lines, ['def', '', 'g']);
  });

  test('a line over the bound is dropped whole, even across chunks; the next line is intact', () => {
    const s = new LineSplitter(8);
    const first = s.push(Buffer.from('0123456'));
    assert.deepEqual(first, { lines: [], dropped: 0 });
    const second = s.push(Buffer.from('789abc\nok\n'));
    assert.deepEqual(second, { lines: ['ok'], dropped: 1 });
  });
});

describe('parseEventLine', () => {
  test('a MODIFIED line decodes to the VM record', () => {
    const ev = parseEventLine(JSON.stringify({ event: 'MODIFIED', vm: VM }));
    assert.equal(ev?.event, 'MODIFIED');
    assert.equal(ev?.vm.id, VM.id);
    assert.equal(ev?.vm.name, 'vk-a-0');
    assert.equal(ev?.vm.state, 'stopped (stale)');
  });

  test('garbage, unknown kinds and undecodable VMs are skipped', () => {
    assert.equal(parseEventLine('not json'), undefined);
    assert.equal(parseEventLine(JSON.stringify({ event: 'RENAMED', vm: VM })), undefined);
    assert.equal(parseEventLine(JSON.stringify({ event: 'DELETED', vm: { id: 1 } })), undefined);
    assert.equal(parseEventLine('null'), undefined);
  });
});
