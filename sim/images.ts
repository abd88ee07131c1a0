// Registering images in the image DBs (<root>/oci/db, <root>/cloudimg/db) with blob placeholders.
import fs from 'node:fs';
import path from 'node:path';
import { type ImageRecord, isCloudImage, nowIso, updateImageDb } from './db.ts';
import { imageBlob } from './paths.ts';

/** Adds an image record (as a pull would) and its blob placeholder. */
export function registerImage(root: string, name: string, digest: string): ImageRecord {
  const kind = isCloudImage(name) ? 'cloudimg' : 'oci';
  const hex = digest.replace(/^sha256:/, '');
  const rec: ImageRecord = {
    id: digest,
    name,
    type: kind,
    size: 100_000_000 + (Number.parseInt(hex.slice(0, 6), 16) || 0) * 16,
    created_at: nowIso(),
  };
  updateImageDb(root, kind, (db) => {
    const old = db.names[name];
    if (old && old !== digest) delete db.images[old];
    db.images[digest] = rec;
    db.names[name] = digest;
  });
  const blob = imageBlob(root, kind, hex);
  fs.mkdirSync(path.dirname(blob), { recursive: true });
  if (!fs.existsSync(blob)) fs.writeFileSync(blob, '');
  return rec;
}
