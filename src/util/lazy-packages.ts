// Packages the daemon needs only on rare paths, required on their first use instead of imported
// at startup: every module loaded stays in the daemon's memory for its whole life, and a node
// that never serves a WebSocket exec or moves a snapshot through a registry has no use for ws
// or tar-stream (and streamx & co.), a node that never serves or fetches a peer slice has no
// use for the CRC-32C addon, and one without Google credentials none for google-auth-library
// (docs/decisions.md "Daemon memory"). Synchronous, so the
// paths that need them gain no await. The release build finds the literal specifiers below and
// ships the packages (packaging/build.ts loads them from the staged tree).
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let ws: typeof import('ws') | undefined;
let tar: typeof import('tar-stream') | undefined;
let crc: typeof import('@node-rs/crc32') | undefined;
let googleAuth: typeof import('google-auth-library') | undefined;

/** `ws`, on the first WebSocket exec. */
export function wsPackage(): typeof import('ws') {
  ws ??= require('ws') as typeof import('ws');
  return ws;
}

/** `tar-stream`, on the first registry pull or push. */
export function tarStream(): typeof import('tar-stream') {
  tar ??= require('tar-stream') as typeof import('tar-stream');
  return tar;
}

/** `google-auth-library`, on the first registry credential lookup with Google application
 * default credentials configured (never on a node that does not use them). */
export function googleAuthPackage(): typeof import('google-auth-library') {
  googleAuth ??= require('google-auth-library') as typeof import('google-auth-library');
  return googleAuth;
}

/** `@node-rs/crc32`, a native addon (~3.4 MB of resident memory once loaded), on the first peer
 * slice served or fetched. */
export function crc32Package(): typeof import('@node-rs/crc32') {
  crc ??= require('@node-rs/crc32') as typeof import('@node-rs/crc32');
  return crc;
}
