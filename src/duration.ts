// Owns how a span of time reads in the service's words for operators (reasons, warnings, the
// readiness checklist): one way, so a grace, a refresh time and a snapshot's age read alike.
// Below a second it counts milliseconds; seconds and minutes run up to two of the next unit
// (119.9 s, then 2 min; 119.9 min, then 2 h), so short spans keep their precision. The unit is
// chosen after rounding: 119.96 s reads "2 min", never "120.0 s". Seconds always show their tenth
// ("8.0 s of its 10.0 s grace"); minutes and hours only when there is one ("60 min", "2.5 min").
// It also masks those spans in a text, for what compares texts apart from their times (ETags).

const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;

/**
 * "850 ms", "1.5 s", "119.9 s", "2 min", "59.8 min", "2 h", "24 h". Callers pass spans that should
 * not be negative; one that is (a clock stepped back) keeps its minus sign rather than hiding it.
 */
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
