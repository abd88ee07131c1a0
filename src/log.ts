// Structured JSON logging (pino). Child loggers carry `pod` and `vm` keys so every line
// about a pod or VM can be found with one filter.
import { type Logger, pino } from 'pino';

export type { Logger };

export function createLogger(level: string, destination: NodeJS.WritableStream = process.stderr): Logger {
  return pino(
    {
      level,
      base: { component: 'vk-cocoon' },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    destination,
  );
}

/** A logger that discards everything (unit tests of modules that take a logger). */
export const silentLogger: Logger = pino({ level: 'silent' });
