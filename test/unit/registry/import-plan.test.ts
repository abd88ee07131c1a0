import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { MEDIA_TYPE } from '../../../src/registry/artifact.ts';
import { parseSnapshotConfig } from '../../../src/registry/artifact-config.ts';
import { nextReadAhead, planTarEntries } from '../../../src/registry/import-plan.ts';
import { d, exampleConfig, snapshot } from './artifact-fixtures.ts';

describe('planTarEntries (registry.md §5 step 3)', () => {
  it('one entry per layer in manifest order: title, blob size, files[].mode or 0640', () => {
    const c = parseSnapshotConfig(JSON.stringify(exampleConfig()), snapshot());
    assert.ok(c.ok);
    const plan = planTarEntries(snapshot(), c.value);
    assert.ok(plan.ok);
    assert.deepEqual(
      plan.value.map((e) => [e.name, e.size, e.mode.toString(8), e.pax]),
      [
        ['config.json', 4211, '640', undefined],
        ['state.json', 88123, '640', undefined],
        ['memory-ranges', 4294967296, '644', undefined],
        ['overlay.qcow2', 1871052800, '640', undefined],
        ['cidata.img', 376832, '640', undefined],
      ],
    );
  });

  it('PAX records COCOON.sparse.map / .size verbatim for files the config marks sparse', () => {
    const files = {
      'overlay.qcow2': { mode: 416, sparseMap: '0,4096,1048576,8192', sparseSize: 1871052800 },
      'cidata.img': { sparseSize: '376832' },
    };
    const c = parseSnapshotConfig(JSON.stringify(exampleConfig({ files })), snapshot());
    assert.ok(c.ok);
    const plan = planTarEntries(snapshot(), c.value);
    assert.ok(plan.ok);
    assert.deepEqual(plan.value[3]!.pax, {
      'COCOON.sparse.map': '0,4096,1048576,8192',
      'COCOON.sparse.size': '1871052800',
    });
    assert.deepEqual(plan.value[4]!.pax, { 'COCOON.sparse.size': '376832' });
    assert.equal(plan.value[3]!.mode, 0o640);
  });

  it('refuses a sparse value with a newline (it would corrupt the PAX record)', () => {
    const c = parseSnapshotConfig(
      JSON.stringify(exampleConfig({ files: { 'state.json': { sparseMap: '1\nCOCOON.x=y' } } })),
      snapshot(),
    );
    assert.ok(c.ok);
    const plan = planTarEntries(snapshot(), c.value);
    assert.equal(plan.ok, false);
  });
});

describe('nextReadAhead (registry.md §5 step 4)', () => {
  const MiB = 1024 * 1024;
  const base = {
    head: 0,
    sizes: [1, 10 * MiB, 4000 * MiB, 1800 * MiB, 5],
    started: new Set([0]),
    inFlight: 1,
    concurrency: 8,
    freeBudget: 2048 * MiB,
  };

  it('reads ahead the next layer that fits in the free budget, skipping one that does not', () => {
    assert.equal(nextReadAhead(base), 1);
    assert.equal(nextReadAhead({ ...base, started: new Set([0, 1]) }), 3);
    assert.equal(nextReadAhead({ ...base, started: new Set([0, 1, 3]), freeBudget: 248 * MiB }), 4);
    assert.equal(nextReadAhead({ ...base, started: new Set([0, 1, 3, 4]) }), undefined);
  });

  it('never more than the concurrency, never the head or earlier layers', () => {
    assert.equal(nextReadAhead({ ...base, inFlight: 8 }), undefined);
    assert.equal(nextReadAhead({ ...base, head: 4, started: new Set([0, 1, 2, 3, 4]) }), undefined);
    assert.equal(nextReadAhead({ ...base, head: 2, started: new Set([2]) }), 3);
  });

  it('a zero budget reads nothing ahead except empty layers', () => {
    assert.equal(nextReadAhead({ ...base, freeBudget: 0 }), undefined);
    assert.equal(nextReadAhead({ ...base, sizes: [1, 0], freeBudget: 0 }), 1);
  });

  it('property: the chosen layer is after the head, unstarted and fits', () => {
    fc.assert(
      fc.property(
        fc.array(fc.nat(100), { minLength: 1, maxLength: 12 }),
        fc.nat(11),
        fc.nat(200),
        fc.nat(4),
        fc.nat(4),
        fc.array(fc.nat(11)),
        (sizes, head, freeBudget, inFlight, extra, startedList) => {
          const started = new Set(startedList);
          const got = nextReadAhead({
            head,
            sizes,
            started,
            inFlight,
            concurrency: inFlight + extra,
            freeBudget,
          });
          if (got === undefined) {
            return extra === 0 || sizes.every((s, i) => i <= head || started.has(i) || s > freeBudget);
          }
          return got > head && !started.has(got) && sizes[got]! <= freeBudget && extra > 0;
        },
      ),
    );
  });
});

describe('planTarEntries, v2 (registry.md §4.4: chunks authoritative, +zstd, uncompressed size)', () => {
  const Z = (t: string) => `${t}+zstd`;
  const layer = (
    mediaType: string,
    n: number,
    size: number,
    title: string,
    extra: Record<string, string> = {},
  ) => ({
    mediaType,
    digest: d(n),
    size,
    annotations: { 'org.opencontainers.image.title': title, ...extra },
  });
  const chunk = (n: number, size: number, index: number, count: number) =>
    layer(Z(MEDIA_TYPE.vmMemory), n, size, 'memory-ranges', {
      'cocoonstack.chunk.index': String(index),
      'cocoonstack.chunk.count': String(count),
    });
  const v2 = (layers: unknown[]) =>
    snapshot({
      schemaVersion: 2,
      mediaType: MEDIA_TYPE.ociManifest,
      artifactType: MEDIA_TYPE.snapshotV2,
      config: { mediaType: MEDIA_TYPE.snapshotConfig, digest: d(1), size: 900 },
      layers,
    });
  const plan = (layers: unknown[], files: Record<string, unknown>) => {
    const m = v2(layers);
    const c = parseSnapshotConfig(JSON.stringify(exampleConfig({ schemaVersion: 'v2', files })), m);
    assert.ok(c.ok, c.ok ? '' : c.error);
    return planTarEntries(m, c.value);
  };
  const failsWith = (r: ReturnType<typeof plan>, re: RegExp) => {
    assert.equal(r.ok, false);
    if (!r.ok) assert.match(r.error, re);
  };

  it('a chunked, compressed file: its chunks in `chunks` order (not layer order), size the uncompressed size', () => {
    const r = plan(
      [
        layer(MEDIA_TYPE.vmConfig, 2, 100, 'config.json'),
        chunk(11, 700, 1, 3),
        chunk(10, 900, 0, 3),
        chunk(12, 50, 2, 3),
      ],
      { 'memory-ranges': { mode: 420, size: 5 << 20, chunks: [d(10), d(11), d(12)] } },
    );
    assert.ok(r.ok, r.ok ? '' : r.error);
    assert.deepEqual(
      r.value.map((e) => [e.name, e.size, e.mode.toString(8), e.parts.map((p) => [p.layer.digest, p.zstd])]),
      [
        ['config.json', 100, '640', [[d(2), false]]],
        [
          'memory-ranges',
          5 << 20,
          '644',
          [
            [d(10), true],
            [d(11), true],
            [d(12), true],
          ],
        ],
      ],
    );
  });

  it('one compressed blob without chunks; a raw blob whose size the config confirms; sparse PAX kept', () => {
    const r = plan(
      [
        layer(Z(MEDIA_TYPE.diskQcow2), 20, 3000, 'overlay.qcow2'),
        layer(MEDIA_TYPE.vmState, 21, 77, 'state.json'),
      ],
      {
        'overlay.qcow2': { size: 9 << 20, sparseMap: '0,4096', sparseSize: 20 << 30 },
        'state.json': { size: 77 },
      },
    );
    assert.ok(r.ok, r.ok ? '' : r.error);
    assert.deepEqual(
      r.value.map((e) => [e.name, e.size, e.parts.length, e.parts[0]!.zstd, e.pax]),
      [
        [
          'overlay.qcow2',
          9 << 20,
          1,
          true,
          { 'COCOON.sparse.map': '0,4096', 'COCOON.sparse.size': String(20 << 30) },
        ],
        ['state.json', 77, 1, false, undefined],
      ],
    );
  });

  it('two identical chunks (one digest listed twice) take the layers annotated with their index', () => {
    const r = plan([chunk(30, 10, 0, 2), chunk(30, 10, 1, 2)], {
      'memory-ranges': { size: 2 << 20, chunks: [d(30), d(30)] },
    });
    assert.ok(r.ok, r.ok ? '' : r.error);
    assert.deepEqual(
      r.value[0]!.parts.map((p) => p.layer.annotations['cocoonstack.chunk.index']),
      ['0', '1'],
    );
  });

  it('refuses what it cannot reassemble, naming the file', () => {
    failsWith(
      plan([chunk(10, 9, 0, 2), chunk(11, 9, 1, 2)], { 'memory-ranges': { size: 2, chunks: [d(10)] } }),
      /layer sha256:0+b titled "memory-ranges" is not in files\[memory-ranges\]\.chunks/,
    );
    failsWith(
      plan([chunk(10, 9, 0, 2)], { 'memory-ranges': { size: 2, chunks: [d(10), d(99)] } }),
      /files\[memory-ranges\]\.chunks\[1\] sha256:0+63 is not a layer titled "memory-ranges"/,
    );
    failsWith(
      plan([chunk(10, 9, 0, 2), chunk(11, 9, 1, 2)], {
        'memory-ranges': { size: 2, chunks: [d(11), d(10)] },
      }),
      /chunks\[0\] is the layer annotated cocoonstack\.chunk\.index=1: the chunk order disagrees/,
    );
    failsWith(
      plan([chunk(10, 9, 0, 3), chunk(11, 9, 1, 3)], {
        'memory-ranges': { size: 2, chunks: [d(10), d(11)] },
      }),
      /lists 2 chunks but its layer 0 is annotated cocoonstack\.chunk\.count=3/,
    );
    failsWith(
      plan([chunk(10, 9, 0, 2), chunk(11, 9, 1, 2)], { 'memory-ranges': { mode: 420 } }),
      /2 layers titled "memory-ranges" but files\[memory-ranges\] has no chunks list/,
    );
    failsWith(
      plan([chunk(10, 9, 0, 1)], {}),
      /files\[memory-ranges\]: no size \(required for a compressed file\)/,
    );
    failsWith(
      plan([layer(MEDIA_TYPE.vmState, 21, 77, 'state.json')], { 'state.json': { size: 78 } }),
      /files\[state\.json\]: size 78 but its blob has 77 bytes/,
    );
    failsWith(plan([chunk(10, 9, 0, 1)], { 'memory-ranges': { size: 2, chunks: [] } }), /chunks is empty/);
  });

  it('v1: a chunks list is refused ("chunked but manifest is not v2")', () => {
    const c = parseSnapshotConfig(
      JSON.stringify(exampleConfig({ files: { 'state.json': { chunks: [d(3)] } } })),
      snapshot(),
    );
    assert.ok(c.ok);
    const r = planTarEntries(snapshot(), c.value);
    failsWith(r, /files\[state\.json\]: chunked but manifest is not v2/);
  });
});
