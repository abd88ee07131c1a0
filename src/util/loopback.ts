// What "loopback" means everywhere in vk-cocoon (docs/security.md): the IPv4 block
// 127.0.0.0/8, the IPv6 address ::1 (also as an IPv4-mapped 127/8 address), and the name
// `localhost`. One definition, used by the registry's plain-HTTP rule, the debug endpoints'
// listener check and the kubelet API's `none` authentication guard.
import { isIPv4, isIPv6 } from 'node:net';

/** True for an IP literal in 127.0.0.0/8 or ::1 (brackets and an IPv4-mapped form allowed). */
export function isLoopbackAddress(address: string): boolean {
  let a = address.trim().toLowerCase();
  if (a.startsWith('[') && a.endsWith(']')) a = a.slice(1, -1);
  if (isIPv4(a)) return a.split('.')[0] === '127';
  if (!isIPv6(a)) return false;
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/.exec(a);
  if (mapped) return isLoopbackAddress(mapped[1]!);
  return a === '::1' || /^0{0,4}(:0{0,4}){6}:0{0,3}1$/.test(a);
}

/** The host part of `host[:port]` (`[v6]:port` keeps no brackets), lower-cased. */
export function hostOf(hostPort: string): string {
  const h = hostPort.trim().toLowerCase();
  if (h.startsWith('[')) {
    const end = h.indexOf(']');
    return end < 0 ? h : h.slice(1, end);
  }
  if (isIPv6(h)) return h;
  const colon = h.lastIndexOf(':');
  return colon < 0 ? h : h.slice(0, colon);
}

/** True when `host[:port]` names a loopback host: `localhost` or a loopback address. An
 * empty host (`:9091`, every interface) is not loopback. */
export function isLoopbackHost(hostPort: string): boolean {
  const h = hostOf(hostPort);
  return h === 'localhost' || isLoopbackAddress(h);
}
