// image pull / inspect / import (cocoon-cli.md §2, §3.4, §8.7). A pull of an http(s) URL
// yields a cloud image, anything else an OCI image; the digest is deterministic per reference
// (imageDigestFor) unless the `images.digests` knob overrides it.
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { bool, type CommandSpec, type Parsed } from '../cli.ts';
import type { Ctx, Verb } from '../ctx.ts';
import { findImage, type ImageRecord, imageDigestFor, isCloudImage, nowIso, updateImageDb } from '../db.ts';
import { CliError } from '../errors.ts';
import { registerImage } from '../images.ts';
import { imageBlob } from '../paths.ts';

const spec = (p: string, usage: string, flags: CommandSpec['flags'], minArgs: number, maxArgs: number) =>
  ({ path: p, usage, flags, minArgs, maxArgs }) satisfies CommandSpec;

// registry/repo[:tag][@sha256:digest], lower-case repository path components.
const OCI_REF =
  /^(?:[a-zA-Z0-9.-]+(?::\d+)?\/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:\/[a-z0-9]+(?:[._-][a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$/;

async function pull(ctx: Ctx, p: Parsed): Promise<number> {
  const ref = p.args[0] as string;
  const force = bool(p, 'force');
  if (!isCloudImage(ref) && !OCI_REF.test(ref)) throw new CliError(`invalid image reference "${ref}"`);
  const existing = findImage(ctx.root, ref);
  if (existing && !force) {
    ctx.out(`${ref}: image is up to date (${existing.id})`);
    return 0;
  }
  const rec = registerImage(ctx.root, ref, imageDigestFor(ref, ctx.knobs.images?.digests));
  ctx.out(`${ref}: pulled (${rec.id})`);
  return 0;
}

async function inspect(ctx: Ctx, p: Parsed): Promise<number> {
  const ref = p.args[0] as string;
  const rec = findImage(ctx.root, ref);
  if (!rec) throw new CliError(`image "${ref}" not found in any backend`);
  ctx.json(rec);
  return 0;
}

async function importImage(ctx: Ctx, p: Parsed): Promise<number> {
  const name = p.args[0] as string;
  if (!/^[a-zA-Z0-9][a-zA-Z0-9._:/@-]{0,254}$/.test(name)) throw new CliError(`invalid image name "${name}"`);
  const hash = crypto.createHash('sha256');
  let size = 0;
  for await (const chunk of ctx.io.stdin) {
    hash.update(chunk as Buffer);
    size += (chunk as Buffer).length;
  }
  ctx.stdinBytes = size;
  if (size === 0) throw new CliError(`import ${name}: empty disk stream on stdin`);
  await ctx.latency();
  const digest = `sha256:${hash.digest('hex')}`;
  const hex = digest.slice(7);
  const blob = imageBlob(ctx.root, 'cloudimg', hex);
  fs.mkdirSync(path.dirname(blob), { recursive: true });
  const fd = fs.openSync(blob, 'w');
  fs.ftruncateSync(fd, size); // sparse placeholder of the real size; the bytes are not kept
  fs.closeSync(fd);
  const rec: ImageRecord = { id: digest, name, type: 'cloudimg', size, created_at: nowIso() };
  updateImageDb(ctx.root, 'cloudimg', (db) => {
    const old = db.names[name];
    if (old && old !== digest) delete db.images[old];
    db.images[digest] = rec;
    db.names[name] = digest;
  });
  ctx.out(`${name}: imported (${digest})`);
  return 0;
}

export const verbs: Record<string, Verb> = {
  pull: {
    spec: spec('image pull', 'image pull [--force] IMAGE', [{ name: 'force', type: 'bool' }], 1, 1),
    run: pull,
  },
  inspect: { spec: spec('image inspect', 'image inspect IMAGE|DIGEST', [], 1, 1), run: inspect },
  import: {
    spec: spec('image import', 'image import NAME < disk', [], 1, 1),
    reserving: true,
    run: importImage,
  },
};
