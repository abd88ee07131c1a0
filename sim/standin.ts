// The stand-in "hypervisor" of a VM that needs a socket server: cloud-image and Windows VMs
// (console.sock: SAC or a Linux login prompt), and any VM when guest.serveVsock is on
// (vsock.uds: `CONNECT <port>\n` ⇒ `OK <n>\n`). Other VMs' stand-in is a plain `sleep`.
// Usage: node standin.ts <root> <vm id>. Runs until killed (or until the root disappears).
import fs from 'node:fs';
import module from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { readGuest } from './guest.ts';
import { loadKnobs } from './knobs.ts';
import { runDir } from './paths.ts';
import { serveConsole } from './sac.ts';

const [root, vmId] = process.argv.slice(2);
if (!root || !vmId) {
  process.stderr.write('usage: standin.ts <root> <vm id>\n');
  process.exit(2);
}
// Long-lived and killed, never exiting normally: write the compile cache now, or every
// stand-in would pay for TypeScript stripping (and its ~12 MB) forever.
module.flushCompileCache?.();
const guest = readGuest(root, vmId);
if (!guest) {
  process.stderr.write(`standin: no guest state for ${vmId}\n`);
  process.exit(1);
}
process.title = guest.dir === 'firecracker' ? 'firecracker' : 'cloud-hypervisor';
const log = (msg: string) => process.stdout.write(`${new Date().toISOString()} ${msg}\n`);
const rd = runDir(root, guest.dir, vmId);
const knobs = await loadKnobs(root).catch(() => ({}) as Awaited<ReturnType<typeof loadKnobs>>);

function listen(file: string, onConn: (s: net.Socket) => void): void {
  fs.rmSync(file, { force: true });
  const server = net.createServer(onConn);
  server.on('error', (e) => log(`listen ${path.basename(file)}: ${e.message}`));
  server.listen(file);
}

if (guest.imageType === 'cloudimg' || guest.windows) {
  listen(path.join(rd, 'console.sock'), (s) =>
    serveConsole(s, { root, vmId, windows: guest.windows, name: guest.name }),
  );
}
if (knobs.guest?.serveVsock) {
  listen(path.join(rd, 'vsock.uds'), (s) => {
    let buf = '';
    s.on('error', () => s.destroy());
    s.on('data', (d: Buffer) => {
      buf += d.toString('latin1');
      const nl = buf.indexOf('\n');
      if (nl < 0) return;
      const m = /^CONNECT (\d+)$/.exec(buf.slice(0, nl).trim());
      if (m) s.write(`OK ${1_073_741_824 + Number(m[1])}\n`);
      else s.end();
    });
  });
}
log(`vm ${vmId} (${guest.name}) running`);
// Exit when the root disappears (a test removed it without killing us).
setInterval(() => {
  if (!fs.existsSync(root)) process.exit(0);
}, 30_000);
