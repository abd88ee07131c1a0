// The port the node agent owns: runtime health, which turns heartbeats off while the
// runtime does not answer.

export interface NodeHealth {
  /** Resolves when the runtime answers (cocoon `vm list` within 10 s); rejects otherwise. */
  ping(signal: AbortSignal): Promise<void>;
}
