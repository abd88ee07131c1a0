// vm inspect / vm list: the provider's most frequent calls, kept to a minimal import set.
import type { CommandSpec, Parsed } from '../cli.ts';
import { str } from '../cli.ts';
import type { Ctx, Verb } from '../ctx.ts';
import { allVms, mustFindVm, presentVm } from '../db.ts';
import { CliError } from '../errors.ts';

const spec = (path: string, usage: string, flags: CommandSpec['flags'], minArgs: number, maxArgs: number) =>
  ({ path, usage, flags, minArgs, maxArgs }) satisfies CommandSpec;

function emptyList(ctx: Ctx, message: string): void {
  const mode = ctx.knobs.list?.empty ?? 'message';
  if (mode === 'message') ctx.out(message);
  else if (mode === '[]') ctx.out('[]');
}

async function inspect(ctx: Ctx, p: Parsed): Promise<number> {
  const { vm } = mustFindVm(ctx.root, p.args[0] as string);
  ctx.json(presentVm(ctx.root, vm));
  return 0;
}

function listFormat(p: Parsed): 'json' | 'table' {
  const o = str(p, 'output') ?? 'table';
  if (o !== 'json' && o !== 'table')
    throw new CliError(`unsupported output format "${o}" (want json or table)`);
  return o;
}

async function list(ctx: Ctx, p: Parsed): Promise<number> {
  const format = listFormat(p);
  const vms = allVms(ctx.root).map((l) => presentVm(ctx.root, l.vm));
  if (vms.length === 0) {
    emptyList(ctx, 'No VMs found.');
    return 0;
  }
  if (format === 'json') {
    ctx.json(vms);
    return 0;
  }
  const rows = [['ID', 'NAME', 'STATE', 'CPU', 'MEMORY', 'IMAGE']];
  for (const v of vms) {
    rows.push([
      v.id,
      v.config.name,
      v.state,
      String(v.config.cpu ?? ''),
      String(v.config.memory ?? ''),
      v.config.image ?? '',
    ]);
  }
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length))) ?? [];
  ctx.out(
    rows
      .map((r) =>
        r
          .map((c, i) => c.padEnd(widths[i] ?? 0))
          .join('  ')
          .trimEnd(),
      )
      .join('\n'),
  );
  return 0;
}

export const verbs: Record<string, Verb> = {
  inspect: { spec: spec('vm inspect', 'vm inspect VM', [], 1, 1), run: inspect },
  list: {
    spec: spec('vm list', 'vm list [-o json]', [{ name: 'output', short: 'o', type: 'string' }], 0, 0),
    run: list,
  },
};
