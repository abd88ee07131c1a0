import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { hostOf, isLoopbackAddress, isLoopbackHost } from '../../../src/util/loopback.ts';

describe('loopback', () => {
  it('127.0.0.0/8 and ::1 are loopback addresses', () => {
    for (const a of [
      '127.0.0.1',
      '127.0.0.2',
      '127.255.255.254',
      '::1',
      '[::1]',
      '0:0:0:0:0:0:0:1',
      '::ffff:127.0.0.9',
    ])
      assert.equal(isLoopbackAddress(a), true, a);
  });
  it('everything else is not', () => {
    for (const a of [
      '128.0.0.1',
      '10.0.0.1',
      '0.0.0.0',
      '::',
      '::2',
      '::ffff:10.0.0.1',
      'localhost',
      '',
      '127.0.0',
    ])
      assert.equal(isLoopbackAddress(a), false, a);
  });
  it('hosts with ports: localhost by name, loopback addresses, never an empty host', () => {
    assert.equal(isLoopbackHost('localhost:5000'), true);
    assert.equal(isLoopbackHost('LOCALHOST'), true);
    assert.equal(isLoopbackHost('127.0.0.3:9091'), true);
    assert.equal(isLoopbackHost('[::1]:9091'), true);
    assert.equal(isLoopbackHost(':9091'), false);
    assert.equal(isLoopbackHost('0.0.0.0:9091'), false);
    assert.equal(isLoopbackHost('localhost.example.com:80'), false);
    assert.equal(isLoopbackHost('registry.example:5000'), false);
  });
  it('hostOf strips the port and the brackets', () => {
    assert.equal(hostOf('[::1]:80'), '::1');
    assert.equal(hostOf('::1'), '::1');
    assert.equal(hostOf('Example.COM:443'), 'example.com');
  });
});
