// Shared helpers of the lifecycle integration tests: simulator logs, knobs, pod patches.
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { CoreV1Api, V1Pod } from '@kubernetes/client-node';
import { PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import type { World } from '../ground/world.ts';

export interface GuestCall {
  ts: string;
  vmId: string;
  name: string;
  argv: string[];
  exit: number;
  delivered: boolean;
  error?: string;
}

export function guestCalls(w: World, vmName?: string): GuestCall[] {
  const file = join(w.simRoot, 'sim', 'guest.jsonl');
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as GuestCall)
    .filter((c) => vmName === undefined || c.name === vmName);
}

export interface CliCall {
  argv: string[];
  exit: number;
  startedAt: string;
}

export function cliCalls(w: World): CliCall[] {
  const file = join(w.simRoot, 'sim', 'calls.jsonl');
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as CliCall);
}

/** Writes the simulator knob file (re-read by every invocation). */
export function setKnobs(w: World, knobs: Record<string, unknown>): void {
  mkdirSync(join(w.simRoot, 'sim'), { recursive: true });
  writeFileSync(join(w.simRoot, 'sim', 'config.json'), JSON.stringify(knobs, null, 2));
}

export function leaseFor(w: World, mac: string): { ip: string } | undefined {
  if (!existsSync(w.leasesPath)) return undefined;
  const text = readFileSync(w.leasesPath, 'utf8').trim();
  if (!text || text === 'null') return undefined;
  const rows = JSON.parse(text) as { mac: string; ip: string }[];
  return rows.find((r) => r.mac.toLowerCase() === mac.toLowerCase());
}

export async function simVm(
  w: World,
  name: string,
): Promise<
  | {
      id: string;
      network_configs: { mac: string; network?: { ip: string; prefix: number; gateway: string } | null }[];
      hypervisor: string;
    }
  | undefined
> {
  try {
    return JSON.parse(await w.sim(['vm', 'inspect', name]));
  } catch {
    return undefined;
  }
}

export const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);

export async function annotate(
  core: CoreV1Api,
  ns: string,
  name: string,
  annotations: Record<string, string | null>,
): Promise<void> {
  await core.patchNamespacedPod({ namespace: ns, name, body: { metadata: { annotations } } }, mergePatch);
}

export const lifecycle = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/lifecycle-state'] ?? '';
export const postClone = (p: V1Pod) => p.metadata?.annotations?.['vm.cocoonstack.io/post-clone-state'] ?? '';
export const isReady = (p: V1Pod) =>
  p.status?.conditions?.some((c) => c.type === 'Ready' && c.status === 'True') ?? false;
