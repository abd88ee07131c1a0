// Error types that map to cocoon's process contract: `Error: <msg>` on stderr and exit 1.

/** A cocoon-side failure: printed as `Error: <message>` on stderr, exit status `exit` (1). */
export class CliError extends Error {
  readonly exit: number;
  constructor(message: string, exit = 1) {
    super(message);
    this.exit = exit;
  }
}

/** A scripted outcome (fault knob): raw stdout/stderr and an exit status, printed verbatim. */
export class ScriptedExit extends Error {
  readonly exit: number;
  readonly stdout: string;
  readonly stderr: string;
  constructor(exit: number, stdout: string, stderr: string) {
    super(`scripted exit ${exit}`);
    this.exit = exit;
    this.stdout = stdout;
    this.stderr = stderr;
  }
}
