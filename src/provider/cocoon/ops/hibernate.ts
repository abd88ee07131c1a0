// Hibernate requests. The hibernate tier (snapshot, push, wake) is not built yet: a request
// fails loudly with `HibernateUnsupported` and a `hibernate: ` message, live, at create and
// at startup alike (docs/decisions.md). Hibernate and wake will live here.
import type { ProviderContext } from '../context.ts';
import { failOp } from '../publication/lifecycle.ts';
import type { PodRecord } from '../state.ts';
import { createFailed } from './failure.ts';

export const HIBERNATE_UNSUPPORTED =
  'hibernate: hibernation is not supported by this vk-cocoon release (the hibernate tier is not built yet)';

export async function refuseHibernate(
  ctx: ProviderContext,
  rec: PodRecord,
  op: 'create' | 'update',
): Promise<void> {
  if (op === 'create') {
    await createFailed(ctx, rec, 'HibernateUnsupported', HIBERNATE_UNSUPPORTED, false);
    return;
  }
  await failOp(ctx, rec, op, 'HibernateUnsupported', HIBERNATE_UNSUPPORTED);
}
