/**
 * Registry credential sources (docs/registry.md "Authentication" item 2), tried in order for a host. Only the
 * docker config source exists in this tier; Google Application Default Credentials plug in
 * here as another {@link CredentialSource} placed first (see {@link defaultCredentialSources}).
 */
import { readFile } from 'node:fs/promises';
import { homedir } from 'node:os';
import { join } from 'node:path';
import type { Logger } from '../log.ts';
import { type Credential, dockerConfigCredential } from './auth.ts';

/** Returns the credential for a registry host (`host[:port]`), or `undefined`. */
export type CredentialSource = (host: string) => Promise<Credential | undefined>;

/** `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`. */
export function dockerConfigPath(env: NodeJS.ProcessEnv = process.env): string {
  const dir = env.DOCKER_CONFIG;
  return dir !== undefined && dir !== ''
    ? join(dir, 'config.json')
    : join(homedir(), '.docker', 'config.json');
}

/**
 * Credentials from the docker config file, read at each lookup (lookups happen only when a
 * registry challenges, so a rotated file is picked up without a restart). A missing file
 * means no credential; an unreadable or malformed one is logged and means no credential.
 */
export function dockerConfigSource(env: NodeJS.ProcessEnv = process.env, log?: Logger): CredentialSource {
  const path = dockerConfigPath(env);
  return async (host) => {
    let text: string;
    try {
      text = await readFile(path, 'utf8');
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'ENOENT') {
        log?.warn({ path, err: (error as Error).message }, 'cannot read docker config');
      }
      return undefined;
    }
    try {
      return dockerConfigCredential(JSON.parse(text), host);
    } catch (error) {
      log?.warn({ path, err: (error as Error).message }, 'malformed docker config');
      return undefined;
    }
  };
}

/** The first credential any source has for `host`. */
export async function lookupCredential(
  sources: readonly CredentialSource[],
  host: string,
): Promise<Credential | undefined> {
  for (const source of sources) {
    const cred = await source(host);
    if (cred) return cred;
  }
  return undefined;
}

/**
 * The credential sources of the provider, in the order of docs/registry.md "Authentication":
 *
 * 1. Google Application Default Credentials — **not implemented yet**. The hook is this list: a
 *    future `googleAdcSource()` returning `{username: 'oauth2accesstoken', password: <access
 *    token>}` (refreshed before expiry) goes first. Until then a set
 *    `GOOGLE_APPLICATION_CREDENTIALS` refuses the daemon's startup (src/config/env.ts).
 * 2. The docker config file.
 */
export function defaultCredentialSources(
  env: NodeJS.ProcessEnv = process.env,
  log?: Logger,
): CredentialSource[] {
  return [dockerConfigSource(env, log)];
}
