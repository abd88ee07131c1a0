import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import {
  buildExecStatus,
  errorStreamPayload,
  expectedSpdyStreams,
  httpErrorResponse,
  isSpdyUpgrade,
  isWebSocketUpgrade,
  negotiateSpdyProtocol,
  negotiateWebSocketProtocol,
  parseProtocolOffers,
  parseTerminalSize,
  SPDY_EXEC_PROTOCOLS,
  spdyUpgradeResponse,
  TerminalSizeDecoder,
  WEBSOCKET_EXEC_PROTOCOLS,
} from '../../../src/kubelet/streams/exec-protocol.ts';

/** What client-go's errorDecoderV4 does with the error stream (tools/remotecommand/v4.go). */
function clientGoDecodeV4(message: Buffer): { ok: true } | { exitCode: number } | { error: string } {
  const status = JSON.parse(message.toString()) as {
    status?: string;
    reason?: string;
    message?: string;
    details?: { causes?: Array<{ reason?: string; message?: string }> };
  };
  if (status.status === 'Success') return { ok: true };
  if (status.status !== 'Failure') return { error: 'error stream protocol error: unknown error' };
  if (status.reason === 'NonZeroExitCode') {
    if (!status.details) return { error: 'details must be set' };
    // metav1.StatusCause.Type is the JSON field "reason".
    for (const c of status.details.causes ?? []) {
      if (c.reason !== 'ExitCode') continue;
      if (!/^\d+$/.test(c.message ?? '') || Number(c.message) > 255)
        return { error: 'invalid exit code value' };
      return { exitCode: Number(c.message) };
    }
    return { error: 'no ExitCode cause given' };
  }
  return { error: status.message ?? '' };
}

describe('protocol offers', () => {
  it('splits comma-joined and repeated headers, trimming blanks', () => {
    assert.deepEqual(parseProtocolOffers('v5.channel.k8s.io, v4.channel.k8s.io,,channel.k8s.io '), [
      'v5.channel.k8s.io',
      'v4.channel.k8s.io',
      'channel.k8s.io',
    ]);
    assert.deepEqual(parseProtocolOffers(['v4.channel.k8s.io', ' v3.channel.k8s.io, v2.channel.k8s.io']), [
      'v4.channel.k8s.io',
      'v3.channel.k8s.io',
      'v2.channel.k8s.io',
    ]);
    assert.deepEqual(parseProtocolOffers(undefined), []);
    assert.deepEqual(parseProtocolOffers(' , '), []);
  });

  it('SPDY: first v4/v5 offer wins, else the first supported one', () => {
    const offers = parseProtocolOffers(
      'v5.channel.k8s.io, v4.channel.k8s.io, v3.channel.k8s.io, v2.channel.k8s.io, channel.k8s.io',
    );
    assert.deepEqual(negotiateSpdyProtocol(offers), { name: 'v5.channel.k8s.io', version: 5, base64: false });
    assert.equal(negotiateSpdyProtocol(['channel.k8s.io', 'v4.channel.k8s.io'])?.name, 'v4.channel.k8s.io');
    assert.equal(
      negotiateSpdyProtocol(['v2.channel.k8s.io', 'v3.channel.k8s.io'])?.name,
      'v2.channel.k8s.io',
    );
    assert.equal(negotiateSpdyProtocol(['v9.channel.k8s.io', 'v3.channel.k8s.io'])?.version, 3);
    assert.deepEqual(negotiateSpdyProtocol([]), { name: '', version: 1, base64: false });
    assert.equal(negotiateSpdyProtocol(['v9.channel.k8s.io']), null);
    // base64 variants are WebSocket-only.
    assert.equal(negotiateSpdyProtocol(['base64.channel.k8s.io']), null);
  });

  it('WebSocket: v5, v4 and base64 variants', () => {
    assert.deepEqual(negotiateWebSocketProtocol(['v5.channel.k8s.io']), {
      name: 'v5.channel.k8s.io',
      version: 5,
      base64: false,
    });
    assert.deepEqual(negotiateWebSocketProtocol(['base64.channel.k8s.io', 'v4.base64.channel.k8s.io']), {
      name: 'v4.base64.channel.k8s.io',
      version: 4,
      base64: true,
    });
    assert.deepEqual(negotiateWebSocketProtocol(['base64.channel.k8s.io']), {
      name: 'base64.channel.k8s.io',
      version: 1,
      base64: true,
    });
    assert.equal(negotiateWebSocketProtocol(['v3.channel.k8s.io']), null);
    assert.equal(negotiateWebSocketProtocol([])?.version, 1);
  });

  it('always picks something the client offered and the server supports', () => {
    const pool = [
      ...SPDY_EXEC_PROTOCOLS,
      ...WEBSOCKET_EXEC_PROTOCOLS,
      'v9.channel.k8s.io',
      'SPDY/3.1+portforward.k8s.io',
    ];
    fc.assert(
      fc.property(fc.array(fc.constantFrom(...pool), { minLength: 1, maxLength: 6 }), (offers) => {
        for (const [neg, supported] of [
          [negotiateSpdyProtocol(offers), SPDY_EXEC_PROTOCOLS],
          [negotiateWebSocketProtocol(offers), WEBSOCKET_EXEC_PROTOCOLS],
        ] as const) {
          const common = offers.filter((o) => supported.includes(o));
          if (common.length === 0) assert.equal(neg, null);
          else {
            assert.ok(neg && common.includes(neg.name));
            const best = Math.max(
              ...common.map((o) => (o.startsWith('v5') ? 5 : o.startsWith('v4') ? 4 : 0)),
            );
            if (best >= 4) assert.ok(neg.version >= 4);
          }
        }
      }),
    );
  });
});

describe('upgrade detection and responses', () => {
  it('recognises SPDY and WebSocket upgrades case-insensitively', () => {
    assert.ok(isSpdyUpgrade({ connection: 'Upgrade', upgrade: 'SPDY/3.1' }));
    assert.ok(isSpdyUpgrade({ connection: 'keep-alive, upgrade', upgrade: 'spdy/3.1' }));
    assert.ok(!isSpdyUpgrade({ connection: 'Upgrade', upgrade: 'websocket' }));
    assert.ok(!isSpdyUpgrade({ upgrade: 'SPDY/3.1' }));
    assert.ok(isWebSocketUpgrade({ connection: 'Upgrade', upgrade: 'WebSocket' }));
    assert.ok(!isWebSocketUpgrade({ connection: 'close', upgrade: 'websocket' }));
  });

  it('formats 101 and error responses', () => {
    assert.equal(
      spdyUpgradeResponse({ name: 'v4.channel.k8s.io', version: 4, base64: false }),
      'HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n',
    );
    assert.ok(!spdyUpgradeResponse({ name: '', version: 1, base64: false }).includes('X-Stream'));
    const r = httpErrorResponse(403, 'nope', [['X-Accepted-Stream-Protocol-Versions', 'v4.channel.k8s.io']]);
    assert.match(r, /^HTTP\/1\.1 403 Forbidden\r\n/);
    assert.match(r, /\r\nContent-Length: 5\r\n/);
    assert.match(r, /\r\nX-Accepted-Stream-Protocol-Versions: v4.channel.k8s.io\r\n/);
    assert.ok(r.endsWith('\r\n\r\nnope\n'));
  });
});

describe('expected SPDY streams', () => {
  it('mirrors the kubelet stream set', () => {
    const set = (o: Parameters<typeof expectedSpdyStreams>[0], v: 1 | 2 | 3 | 4 | 5) =>
      [...expectedSpdyStreams(o, v)].sort();
    assert.deepEqual(set({ stdin: true, stdout: true, stderr: true, tty: false }, 4), [
      'error',
      'stderr',
      'stdin',
      'stdout',
    ]);
    assert.deepEqual(set({ stdin: true, stdout: true, stderr: false, tty: true }, 5), [
      'error',
      'resize',
      'stdin',
      'stdout',
    ]);
    // tty swallows stderr; v2 has no resize stream.
    assert.deepEqual(set({ stdin: false, stdout: true, stderr: true, tty: true }, 2), ['error', 'stdout']);
  });
});

describe('exec Status', () => {
  it('exit code: NonZeroExitCode with an ExitCode cause that client-go decodes', () => {
    const payload = errorStreamPayload({ kind: 'exit', code: 3 }, 4)!;
    assert.equal(
      payload.toString(),
      '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}',
    );
    assert.deepEqual(clientGoDecodeV4(payload), { exitCode: 3 });
  });

  it('success and exit 0', () => {
    const ok = '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}';
    assert.equal(errorStreamPayload({ kind: 'success' }, 5)?.toString(), ok);
    assert.equal(errorStreamPayload({ kind: 'exit', code: 0 }, 4)?.toString(), ok);
    assert.deepEqual(clientGoDecodeV4(Buffer.from(ok)), { ok: true });
  });

  it('other errors are an InternalError status', () => {
    const s = buildExecStatus({ kind: 'error', message: 'vm not running' });
    assert.deepEqual(s, {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'Internal error occurred: vm not running',
      reason: 'InternalError',
      details: { causes: [{ message: 'vm not running' }] },
      code: 500,
    });
    assert.deepEqual(clientGoDecodeV4(Buffer.from(JSON.stringify(s))), {
      error: 'Internal error occurred: vm not running',
    });
  });

  it('v1-v3: plain text on failure only', () => {
    for (const v of [1, 2, 3] as const) {
      assert.equal(errorStreamPayload({ kind: 'success' }, v), null);
      assert.equal(
        errorStreamPayload({ kind: 'exit', code: 2 }, v)?.toString(),
        'command terminated with non-zero exit code: 2',
      );
      assert.equal(
        errorStreamPayload({ kind: 'error', message: 'boom' }, v)?.toString(),
        'Internal error occurred: boom',
      );
    }
  });

  it('every exit code 1-255 round-trips through the client-go decoder', () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 255 }), (code) => {
        assert.deepEqual(clientGoDecodeV4(errorStreamPayload({ kind: 'exit', code }, 5)!), {
          exitCode: code,
        });
      }),
    );
  });
});

describe('resize messages', () => {
  it('parses Go-style JSON leniently', () => {
    assert.deepEqual(parseTerminalSize({ Width: 80, Height: 24 }), { width: 80, height: 24 });
    assert.deepEqual(parseTerminalSize({ width: 100, HEIGHT: 30 }), { width: 100, height: 30 });
    assert.deepEqual(parseTerminalSize({ Width: 70000, Height: -1 }), { width: 65535, height: 0 });
    assert.deepEqual(parseTerminalSize({ Width: 10 }), { width: 10, height: 0 });
    assert.equal(parseTerminalSize({ Width: '80', Height: 24 }), null);
    assert.equal(parseTerminalSize([80, 24]), null);
  });

  it('decodes a message sequence split at any byte, with or without newlines', () => {
    const sizes = fc.array(
      fc
        .tuple(fc.integer({ min: 0, max: 65535 }), fc.integer({ min: 0, max: 65535 }))
        .map(([width, height]) => ({ width, height })),
      { minLength: 1, maxLength: 8 },
    );
    fc.assert(
      fc.property(sizes, fc.boolean(), fc.array(fc.nat(), { maxLength: 10 }), (list, newline, cuts) => {
        const text = list
          .map((s) => JSON.stringify({ Width: s.width, Height: s.height }) + (newline ? '\n' : ''))
          .join('');
        const buf = Buffer.from(text);
        const points = [...new Set(cuts.map((c) => c % (buf.length + 1)))].sort((a, b) => a - b);
        const dec = new TerminalSizeDecoder();
        const got = [];
        let prev = 0;
        for (const p of [...points, buf.length]) {
          got.push(...dec.push(buf.subarray(prev, p)));
          prev = p;
        }
        assert.deepEqual(got, list);
      }),
    );
  });

  it('skips malformed objects and keeps going', () => {
    const dec = new TerminalSizeDecoder();
    assert.deepEqual(dec.push('{"Width":1,"Height":2}\n{"Width":"x"}\n{bad}{"Width":3,'), [
      { width: 1, height: 2 },
    ]);
    assert.deepEqual(dec.push('"Height":4,"note":"a}b"}'), [{ width: 3, height: 4 }]);
  });
});
