// The exec transports of the kubelet API (docs/contracts/virtual-node.md "Exec transports"): SPDY/3.1 (what kube-apiserver speaks
// to kubelets, translating kubectl's WebSocket) and the WebSocket channel protocol (proxied as-is when
// the node declares ExtendWebSocketsToKubelet). Both turn an `upgrade` request into the
// transport-neutral ExecStreams, run the handler, write its outcome on the error stream/channel and
// close. Client disconnect and idle timeout abort the handler's signal. Protocol decisions live in
// exec-protocol.ts; the I/O both transports share in exec-transport.ts; each transport in
// exec-spdy.ts and exec-websocket.ts. This module is their entry point (the kubelet server, the
// container-access port and the tests import from here).

export type { ExecOutcome, TerminalSize } from './exec-protocol.ts';
export { handleSpdyExec } from './exec-spdy.ts';
export type { ExecFinish, ExecHandler, ExecStreams, ExecTransportOptions } from './exec-transport.ts';
export { handleWebSocketExec } from './exec-websocket.ts';
