// Owns how a span of time reads for operators, one way everywhere: ms below a second; seconds and
// minutes up to two of the next unit (119.9 s, then 2 min), the unit chosen after rounding; seconds
// always with their tenth, minutes and hours only when there is one. withoutDurations masks them.

const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;

/** "850 ms", "1.5 s", "119.9 s", "2 min", "2 h"; a negative span (a clock stepped back) keeps its sign. */
export function formatDuration(ms: number): string {
  const size = Math.abs(ms);
  const millis = Math.round(size);
  const sign = ms < 0 && millis > 0 ? '-' : '';
  if (millis < SECOND) return `${sign}${millis} ms`;
  const tenthsOfSecond = Math.round(size / (SECOND / 10));
  if (tenthsOfSecond < 1200) return `${sign}${(tenthsOfSecond / 10).toFixed(1)} s`;
  const tenthsOfMinute = Math.round(size / (MINUTE / 10));
  if (tenthsOfMinute < 1200) return `${sign}${tenthsOfMinute / 10} min`;
  return `${sign}${Math.round(size / (HOUR / 10)) / 10} h`;
}

/** A text with every span formatDuration wrote masked: what it says, apart from how long ago. */
export function withoutDurations(text: string): string {
  return text.replace(/-?\d+(?:\.\d+)? (?:ms|s|min|h)\b/g, '#');
}
