// formatDuration: the one way a span of time reads in reasons, warnings and the readiness
// checklist. Each unit's edges, the rounding that picks the unit, and the spans that should not
// happen (negative, after a clock step).
import t from 'tap';
import { formatDuration, withoutDurations } from '../src/duration.js';

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;

const cases: Array<[what: string, ms: number, words: string]> = [
  ['nothing', 0, '0 ms'],
  ['under half a millisecond rounds to nothing', 0.4, '0 ms'],
  ['milliseconds are whole', 12.5, '13 ms'],
  ['the last millisecond', 999, '999 ms'],
  ['rounding up to a second is a second', 999.5, '1.0 s'],
  ['a second shows its tenth', 1000, '1.0 s'],
  ['tenths round half up', 1450, '1.5 s'],
  ['tenths round down', 1449, '1.4 s'],
  ['a minute is still seconds', MINUTE, '60.0 s'],
  ['the last tenth of a second', 119_949, '119.9 s'],
  ['rounding up to two minutes is minutes', 119_950, '2 min'],
  ['two minutes', 2 * MINUTE, '2 min'],
  ['minutes show a tenth only when there is one', 2.5 * MINUTE, '2.5 min'],
  ['an hour is still minutes', HOUR, '60 min'],
  ['just under an hour', HOUR - 12_000, '59.8 min'],
  ['the last tenth of a minute', 119.9 * MINUTE, '119.9 min'],
  ['rounding up to two hours is hours', 119.95 * MINUTE, '2 h'],
  ['two hours', 2 * HOUR, '2 h'],
  ['hours show a tenth only when there is one', 2.25 * HOUR, '2.3 h'],
  ['a day (the longest max-stale) is hours', 24 * HOUR, '24 h'],
  ['a month is still hours', 30 * 24 * HOUR, '720 h'],
  ['a negative span keeps its sign', -1500, '-1.5 s'],
  ['in every unit', -3 * HOUR, '-3 h'],
  ['negative milliseconds', -3, '-3 ms'],
  ['a negative span that rounds to nothing is nothing', -0.4, '0 ms'],
  ['negative zero', -0, '0 ms'],
];

t.test('each unit up to its edge, the unit chosen after rounding', async (t) => {
  for (const [what, ms, words] of cases) t.equal(formatDuration(ms), words, `${what}: ${ms} ms`);
});

t.test('every span reads as one number and one unit, and never goes back down as it grows', async (t) => {
  const unitOrder = ['ms', 's', 'min', 'h'];
  let previous = { unit: 0, value: 0 };
  for (let ms = 0; ms < 3 * HOUR; ms += ms < 2000 ? 1 : ms < 3 * MINUTE ? 37 : 4999) {
    const words = formatDuration(ms);
    const match = /^(\d+(?:\.\d)?) (ms|s|min|h)$/.exec(words);
    if (!match) {
      t.fail(`${ms} ms reads "${words}"`);
      return;
    }
    const current = { unit: unitOrder.indexOf(match[2]!), value: Number(match[1]) };
    const grew = current.unit > previous.unit || (current.unit === previous.unit && current.value >= previous.value);
    if (!grew) {
      t.fail(`${ms} ms reads "${words}", less than the span before it`);
      return;
    }
    if (current.unit === 1 && !match[1]!.includes('.')) {
      t.fail(`${ms} ms reads "${words}": seconds show their tenth`);
      return;
    }
    if (current.unit > 0 && current.value < (current.unit === 1 ? 1 : 2)) {
      t.fail(`${ms} ms reads "${words}": below the unit's lower edge`);
      return;
    }
    previous = current;
  }
  t.pass('monotonic, one unit each, from 0 to 3 h');
});

t.test('withoutDurations masks every span formatDuration writes, and nothing else', async (t) => {
  const spans = [850, 1500, 119_900, 120_000, 3_588_000, 7_200_000, -250].map(formatDuration);
  t.equal(withoutDurations(`after ${spans.join(', then ')}.`), `after ${spans.map(() => '#').join(', then ')}.`);
  t.equal(withoutDurations('GPU 3 (process 1234, 9000 MiB, 8.8 GiB), 2 shards, tick 4404377'), 'GPU 3 (process 1234, 9000 MiB, 8.8 GiB), 2 shards, tick 4404377');
});
