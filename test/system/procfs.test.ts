import t, { type Test } from 'tap';
import fc from 'fast-check';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import * as fs from 'node:fs';
import type { readdir as Readdir } from 'node:fs/promises';
import * as fsPromises from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { isDeepStrictEqual, promisify } from 'node:util';
import { pino } from 'pino';
import {
  createProcReader,
  isReadable,
  parseBootId,
  parseCgroup,
  parseOpenFilesLimit,
  parseProcStat,
  ProcParseError,
  type ProcStat,
  type StatAnswer,
} from '../../src/system/procfs.js';
import { captureLog } from '../helpers/log-capture.js';

type ProcfsModule = typeof import('../../src/system/procfs.js');

const WARN = 40;

// Builds a stat line the way fs/proc/array.c prints it: fields 3..52 after "pid (comm)".
// Its CPU time is all utime (field 14), stime (15) 0.
function statLine(s: ProcStat): string {
  const middle = ['0', '-1', '4194304', '136', '0', '0', '0', String(s.cpuTicks), '0', '0', '0', '20', '0', '1', '0'];
  const tail = Array.from({ length: 30 }, () => '0');
  return `${s.pid} (${s.comm}) ${[s.state, s.ppid, s.pgrp, s.session, ...middle, s.startTime, ...tail].join(' ')}\n`;
}

/** A readStats answer's stat; undefined when gone or unreadable. */
function readable(answer: StatAnswer | undefined): ProcStat | undefined {
  return isReadable(answer) ? answer : undefined;
}

function errnoError(code: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`${code}: simulated`), { code });
}

// Polls until probe answers something other than undefined; bounded so a bug fails instead of hanging.
async function waitFor<T>(what: string, probe: () => Promise<T | undefined>, timeoutMs = 15_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

t.test('parseProcStat: cases cut from real /proc/PID/stat samples', async (t) => {
  const cases: { name: string; from: string; text: string; want: ProcStat }[] = [
    {
      name: 'comm holding ") (" and a space is everything between the first "(" and the last ")"',
      from: 'test/fixtures/samples/proc-pid-stat_comm-with-paren-and-spaces_local.txt',
      text: '10087 (x) (y z) S 10086 10081 2079 0 -1 4194304 132 0 0 0 0 0 0 0 20 0 1 0 41742 2990080 444 18446744073709551615 94344332558336 94344332576265 140725295065280 0 0 0 0 6 0 1 0 0 17 1 0 0 0 0 0 94344332590352 94344332591616 94344678096896 140725295069920 140725295069936 140725295069936 140725295071211 0\n',
      want: { pid: 10087, comm: 'x) (y z', state: 'S', ppid: 10086, pgrp: 10081, session: 2079, startTime: 41742, cpuTicks: 0 },
    },
    {
      name: 'comm truncated by the kernel to 15 characters',
      from: 'test/fixtures/samples/proc-pid-stat_comm-truncated-15chars_local.txt',
      text: '10096 (averyveryverylo) S 10094 10081 2079 0 -1 4194304 136 0 0 0 0 0 0 0 20 0 1 0 41793 2990080 411 18446744073709551615 94612766515200 94612766533129 140735534004112 0 0 0 0 6 0 1 0 0 17 1 0 0 0 0 0 94612766547216 94612766548480 94613654958080 140735534008999 140735534009035 140735534009035 140735534010327 0',
      want: { pid: 10096, comm: 'averyveryverylo', state: 'S', ppid: 10094, pgrp: 10081, session: 2079, startTime: 41793, cpuTicks: 0 },
    },
    {
      name: 'PID 1 of a VM, whose parent, group and session are 0',
      from: "dev VM's /proc/1/stat (fields 1-22 as in proc(5), /proc/pid/stat, manpages 6.03)",
      text: '1 (process_api) S 0 0 0 0 -1 4194560 31590 312550 0 140 48 266 1018 852 20 0 13 0 31 42799104 3116 18446744073709551615 1 1 0 0 0 0 0 4096 1256 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n',
      want: { pid: 1, comm: 'process_api', state: 'S', ppid: 0, pgrp: 0, session: 0, startTime: 31, cpuTicks: 48 + 266 },
    },
    {
      name: 'zombie left by a killed process group, its field 22 is the only thing after field 21',
      from: 'field layout of proc(5), /proc/pid/stat (manpages 6.03), cut after field 22',
      text: '3743 (sleep) Z 1 3742 3742 0 -1 4228108 97 0 1 0 0 0 0 0 20 0 1 0 41800',
      want: { pid: 3743, comm: 'sleep', state: 'Z', ppid: 1, pgrp: 3742, session: 3742, startTime: 41800, cpuTicks: 0 },
    },
  ];
  for (const c of cases) {
    t.same(parseProcStat(c.text), c.want, `${c.name} (from ${c.from})`);
    t.same(parseProcStat(Buffer.from(c.text)), c.want, `${c.name}, as the bytes read from /proc`);
  }
});

t.test('parseProcStat: a command name the kernel cut inside a multi-byte character reads as its text does', async (t) => {
  // The kernel keeps 15 bytes of a name, wherever that falls: "日本" cut after 5 of its 6 bytes.
  const stat = Buffer.concat([Buffer.from('4242 ('), Buffer.from('日本').subarray(0, 5), Buffer.from(') S 1 4242 4242 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 777 0\n')]);
  const parsed = parseProcStat(stat);
  t.same(parsed, parseProcStat(stat.toString('utf8')));
  t.equal(parsed.comm, '日\ufffd', 'the cut character reads as one replacement character');
});

t.test('parseProcStat: bytes the in-place scan declines are read as text, with the same answer', async (t) => {
  // The scan takes only what the kernel writes; these are valid for the text parser all the same.
  const want = { pid: 3743, comm: 'sleep', state: 'Z', ppid: 1, pgrp: 3742, session: 3742, startTime: 41800, cpuTicks: 0 };
  const head = '3743 (sleep) Z 1 3742 3742 0 -1 4228108 97 0 1 0 0 0 0 0 20 0 1 0 41800';
  for (const [name, text] of [
    ['a tab after field 22', `${head}\t`],
    ['two newlines after field 22', `${head}\n\n`],
    ['spaces and a newline after field 22', `${head}   \n`],
  ] as const) {
    t.same(parseProcStat(Buffer.from(text)), want, name);
  }
});

t.test('parseProcStat: malformed text throws ProcParseError quoting what was wrong', async (t) => {
  const good = '10096 (averyveryverylo) S 10094 10081 2079 0 -1 4194304 136 0 0 0 0 0 0 0 20 0 1 0 41793 2990080';
  const cases: { name: string; text: string; message: RegExp }[] = [
    { name: 'empty text', text: '', message: /no "\(command name\)"/ },
    { name: 'no parentheses', text: '10096 averyveryverylo S 10094', message: /no "\(command name\)".*"10096 averyveryverylo S 10094"/ },
    { name: 'a ")" but no "("', text: '10096 x) S 10094', message: /no "\(command name\)"/ },
    { name: 'a "(" but no ")" after it', text: ') 10096 (x S 10094', message: /no "\(command name\)"/ },
    { name: 'pid is not a number', text: good.replace('10096', 'abc'), message: /field 1 \(pid\)/ },
    { name: 'nothing before the command name', text: good.replace('10096 ', ''), message: /field 1 \(pid\)/ },
    { name: 'no space after the command name', text: good.replace(') S', ')S'), message: /no space after the command name/ },
    { name: 'too few fields: stops at field 6', text: '10096 (x) S 10094 10081 2079', message: /field 22 is missing/ },
    { name: 'too few fields: only the command name', text: '10096 (x) ', message: /field 3 \(state\) "" is not one letter/ },
    { name: 'state is two letters', text: good.replace(') S ', ') SS '), message: /field 3 \(state\) "SS"/ },
    { name: 'ppid is not a number', text: good.replace(' 10094 ', ' 1o094 '), message: /field 4 \(ppid\) "1o094"/ },
    { name: 'pgrp is negative', text: good.replace(' 10081 ', ' -1 '), message: /field 5 \(pgrp\) "-1"/ },
    { name: 'session is empty (double space)', text: good.replace(' 2079 ', '  '), message: /field 6 \(session\) ""/ },
    { name: 'starttime is not a number', text: good.replace(' 41793 ', ' 41793x '), message: /field 22 \(starttime\) "41793x"/ },
    { name: 'starttime beyond a safe integer', text: good.replace(' 41793 ', ' 99999999999999999999 '), message: /field 22 \(starttime\)/ },
  ];
  for (const c of cases) {
    t.throws(() => parseProcStat(c.text), { name: 'ProcParseError', message: c.message }, c.name);
    t.throws(() => parseProcStat(Buffer.from(c.text)), { name: 'ProcParseError', message: c.message }, `${c.name}, as bytes`);
  }

  const long = `no parentheses here ${'x'.repeat(300)}`;
  const err = t.throws(() => parseProcStat(long)) as Error;
  t.ok(err instanceof ProcParseError, 'a real ProcParseError, usable with instanceof');
  t.ok(err.message.length < 250 && err.message.includes('..."'), 'a long text is quoted as an excerpt, not whole');
});

t.test('parseProcStat: any command name round-trips through a synthesized stat line', async (t) => {
  // The kernel prints comm raw (only NUL cannot occur); newlines are included although real names rarely hold them.
  const tricky = fc.constantFrom('(', ')', ' ', ') (', ') S 1 2 3 (', '\n', ':', 'a', 'Z', '9', '-', '\u00e9');
  const comm = fc.oneof(
    fc.string({ unit: tricky, maxLength: 16 }),
    fc.string({ unit: 'binary', maxLength: 64 }).filter((s) => !s.includes('\0')),
  );
  const id = fc.integer({ min: 0, max: 4_194_304 });
  const stat = fc.record({
    pid: fc.integer({ min: 1, max: 4_194_304 }),
    comm,
    state: fc.constantFrom('R', 'S', 'D', 'Z', 'T', 't', 'X', 'I'),
    ppid: id,
    pgrp: id,
    session: id,
    startTime: fc.maxSafeNat(),
    cpuTicks: fc.maxSafeNat(),
  });
  const result = fc.check(
    fc.property(stat, (s) => isDeepStrictEqual(parseProcStat(statLine(s)), { ...s }) && isDeepStrictEqual(parseProcStat(Buffer.from(statLine(s))), { ...s })),
    { numRuns: 300 },
  );
  t.notOk(result.failed, fc.defaultReportMessage(result) ?? 'every synthesized stat line parses back to its fields');
});

t.test('parseProcStat: arbitrary input never throws anything but ProcParseError, and bytes read as their text does', async (t) => {
  const token = fc.constantFrom('(', ')', ' ', '1', '-1', 'S', '\n', '\t', '99999999999999999999', 'x', '\u00e9');
  const text = fc.oneof(fc.string({ unit: 'binary', maxLength: 200 }), fc.string({ unit: token, maxLength: 60 }));
  // Near-valid records, cut and spliced, reach the scan's every exit; raw bytes include invalid UTF-8.
  const record = fc
    .tuple(fc.string({ unit: token, maxLength: 8 }), fc.nat(120), fc.nat(120), fc.string({ unit: token, maxLength: 4 }))
    .map(([comm, at, cut, splice]) => {
      const line = statLine({ pid: 42, comm, state: 'S', ppid: 1, pgrp: 42, session: 42, startTime: 7, cpuTicks: 0 });
      return line.slice(0, at) + splice + line.slice(at + (cut % 6));
    });
  // Valid records whose command name is any bytes at all, invalid UTF-8 included.
  const rawName = fc.uint8Array({ maxLength: 16 }).map((name) =>
    Buffer.concat([Buffer.from('42 ('), name, Buffer.from(statLine({ pid: 42, comm: '', state: 'S', ppid: 1, pgrp: 42, session: 42, startTime: 7, cpuTicks: 0 }).slice(4))]),
  );
  const bytes = fc.oneof(
    text.map((s) => Buffer.from(s)),
    record.map((s) => Buffer.from(s)),
    rawName,
    fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.from(b)),
  );
  const outcome = (read: () => ProcStat): { value: ProcStat } | { error: string } => {
    try {
      return { value: read() };
    } catch (err) {
      if (!(err instanceof ProcParseError) || !err.message.startsWith('malformed /proc stat: ')) throw err;
      return { error: err.message };
    }
  };
  const result = fc.check(
    fc.property(text, (s) => {
      outcome(() => parseProcStat(s));
    }),
    { numRuns: 2000 },
  );
  t.notOk(result.failed, fc.defaultReportMessage(result) ?? 'only ProcParseError is ever thrown');
  const same = fc.check(
    fc.property(bytes, (b) => isDeepStrictEqual(outcome(() => parseProcStat(b)), outcome(() => parseProcStat(b.toString('utf8'))))),
    { numRuns: 4000 },
  );
  t.notOk(same.failed, fc.defaultReportMessage(same) ?? 'bytes give what their text gives: the same fields, or the same error');
});

t.test('readTgid: the process a task id belongs to, from the real /proc; null for none or no Tgid line', async (t) => {
  const real = createProcReader({ root: '/proc', log: pino({ level: 'silent' }) });
  const thread = fs.readdirSync(`/proc/${process.pid}/task`).map(Number).find((tid) => tid !== process.pid)!;
  t.equal(await real.readTgid(process.pid), process.pid);
  t.equal(await real.readTgid(thread), process.pid, 'a thread: its process');
  t.equal(await real.readTgid(2 ** 22 + 1), null, 'no such task');
  const root = t.testdir({ '7': { status: 'Name:\tx\nPid:\t7\n' } });
  t.equal(await createProcReader({ root, log: pino({ level: 'silent' }) }).readTgid(7), null, 'no Tgid line');
});

t.test('bootId: the boot id of the proc root, read once; null without one, with one warning for a bad one', async (t) => {
  const real = fs.readFileSync('/proc/sys/kernel/random/boot_id', 'utf8');
  const silent = pino({ level: 'silent' });
  t.equal(createProcReader({ root: '/proc', log: silent }).bootId(), real.trim(), 'the real /proc: the kernel file, without its newline');
  t.equal(parseBootId('3c5b3c0e-6a4f-4d1e-9f3a-0b8a1c2d3e4f\n'), '3c5b3c0e-6a4f-4d1e-9f3a-0b8a1c2d3e4f');
  for (const bad of ['', 'boot\n', '3c5b3c0e6a4f4d1e9f3a0b8a1c2d3e4f\n', '3C5B3C0E-6A4F-4D1E-9F3A-0B8A1C2D3E4F\n', '3c5b3c0e-6a4f-4d1e-9f3a-0b8a1c2d3e4f0\n']) {
    t.equal(parseBootId(bad), null, JSON.stringify(bad));
  }

  const { log, messages: warnings } = captureLog('warn');
  const root = t.testdir({ sys: { kernel: { random: { boot_id: 'aaaaaaaa-0000-4000-8000-000000000001\n' } } } });
  const reader = createProcReader({ root, log });
  t.equal(reader.bootId(), 'aaaaaaaa-0000-4000-8000-000000000001');
  fs.writeFileSync(`${root}/sys/kernel/random/boot_id`, 'bbbbbbbb-0000-4000-8000-000000000002\n');
  t.equal(reader.bootId(), 'aaaaaaaa-0000-4000-8000-000000000001', 'read once: a boot id does not change while the node runs');
  t.equal(createProcReader({ root, log }).bootId(), 'bbbbbbbb-0000-4000-8000-000000000002', 'a new reader reads it again');
  t.equal(createProcReader({ root: t.testdir({}), log }).bootId(), null, 'a fixture tree without one');
  t.same(warnings(), [], 'says nothing to warn about');

  const junk = createProcReader({ root: t.testdir({ sys: { kernel: { random: { boot_id: 'not a boot id\n' } } } }), log });
  t.equal(junk.bootId(), null);
  t.equal(junk.bootId(), null);
  t.equal(createProcReader({ root: t.testdir({ sys: { kernel: { random: { boot_id: {} } } } }), log }).bootId(), null, 'a directory in its place');
  t.equal(warnings().length, 2, 'one warning per reader, however often it is asked');
  t.match(warnings()[0], /boot_id does not read as a boot id, so a shard registered before the node last restarted is told apart .* by PID and start time alone\. Check that NODECOMPUTE_PROC/);
  t.match(warnings()[1], /Cannot read .*boot_id \(EISDIR/);
});

t.test('parseCgroup: v1, v2 and hybrid files give their paths', async (t) => {
  const podSystemd = '/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7a4b5c9e_1234_4cde_8f00_0123456789ab.slice';
  const cases: { name: string; from: string; text: string; want: string[] }[] = [
    {
      name: 'hybrid v1 + v2, the same path under many controllers listed once',
      from: "dev VM's /proc/self/cgroup",
      text: '9:name=systemd:/\n8:pids:/\n4:memory:/process_api/ed0c4fe1a58750f08d73ca4d605c8c07\n2:cpuacct:/\n0::/\n',
      want: ['/', '/process_api/ed0c4fe1a58750f08d73ca4d605c8c07'],
    },
    {
      name: 'pure v2: one "0::" line, systemd driver of a Kubernetes pod',
      from: 'cgroups(7) format, kubelet systemd cgroup driver naming',
      text: `0::${podSystemd}/cri-containerd-3f1a.scope\n`,
      want: [`${podSystemd}/cri-containerd-3f1a.scope`],
    },
    {
      name: 'v1 with a comma-separated controller list and a ":" inside the path',
      from: 'cgroups(7) format "hierarchy-ID:controller-list:cgroup-path"',
      text: '11:cpu,cpuacct:/kubepods/pod1/ctr:odd\n',
      want: ['/kubepods/pod1/ctr:odd'],
    },
    { name: 'lines without two colons or without a path are skipped', from: 'synthesized', text: '\njunk\n3:memory\n0::\n0::/a\n', want: ['/a'] },
    { name: 'an empty file (a kernel thread without cgroups) has no paths', from: 'synthesized', text: '', want: [] },
  ];
  for (const c of cases) t.same(parseCgroup(c.text), c.want, `${c.name} (from ${c.from})`);

  const line = fc.tuple(fc.nat({ max: 12 }), fc.constantFrom('', 'memory', 'cpu,cpuacct', 'name=systemd'), fc.string({ minLength: 1 }).filter((p) => !p.includes('\n')));
  const result = fc.check(
    fc.property(fc.array(line, { maxLength: 8 }), (lines) => {
      const got = parseCgroup(lines.map(([id, ctl, path]) => `${id}:${ctl}:${path}`).join('\n'));
      return got.length === new Set(lines.map(([, , path]) => path)).size && lines.every(([, , path]) => got.includes(path));
    }),
  );
  t.notOk(result.failed, fc.defaultReportMessage(result) ?? 'every written path comes back exactly once');
});

t.test('real processes: a detached child and its grandchild in the same process group', async (t) => {
  const { log, lines: entries } = captureLog();
  const proc = createProcReader({ root: '/proc', log });
  const child: ChildProcess = spawn('sh', ['-c', 'sleep 60 & echo $!; wait'], { detached: true, stdio: ['ignore', 'pipe', 'ignore'] });
  const childPid = child.pid as number;
  t.teardown(() => {
    try {
      process.kill(-childPid, 'SIGKILL');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
    }
  });
  const lines = createInterface({ input: child.stdout! });
  const [firstLine] = (await once(lines, 'line')) as [string];
  lines.close();
  const grandPid = Number(firstLine);

  const me = await proc.readStat(process.pid);
  const childStat = await proc.readStat(childPid);
  const grandStat = await proc.readStat(grandPid);
  if (me === null || childStat === null || grandStat === null) throw new Error('a live process read as gone');

  t.equal(me.ppid, process.ppid, 'our own stat names our parent');
  t.equal(childStat.ppid, process.pid, 'the child is ours');
  t.equal(childStat.pgrp, childPid, 'detached: the child leads its own process group');
  t.equal(childStat.session, childPid, 'detached: the child leads its own session');
  t.equal(childStat.comm, 'sh');
  t.equal(grandStat.ppid, childPid, "the grandchild is the child's");
  t.equal(grandStat.pgrp, childPid, "the grandchild stays in the child's process group");
  t.equal(grandStat.session, childPid);
  t.ok(me.startTime <= childStat.startTime && childStat.startTime <= grandStat.startTime, 'start times follow spawn order');
  t.equal((await proc.readStat(childPid))?.startTime, childStat.startTime, 'start time is stable across reads');


  const pids = await proc.listPids();
  t.ok(pids.includes(process.pid) && pids.includes(childPid) && pids.includes(grandPid), 'listPids sees all three');
  const myCgroups = await proc.readCgroup(process.pid);
  t.ok(myCgroups !== null && myCgroups.length > 0 && myCgroups.every((p) => p.startsWith('/')), 'our cgroup paths are read');
  const needle = [...(myCgroups ?? [])].sort((a, b) => b.length - a.length)[0] as string;
  t.ok((await proc.findPidsInCgroup(needle)).includes(process.pid), 'a scan of the real /proc finds us in our own cgroup');
  t.same(await proc.checkReadable(), { ok: true }, 'the real /proc is readable');

  const exited = once(child, 'exit');
  process.kill(-childPid, 'SIGKILL');
  await exited;
  t.equal(await waitFor('the child to leave /proc', async () => ((await proc.readStat(childPid)) === null ? null : undefined)), null, 'the killed child reads as gone');
  // The orphaned grandchild is reaped by PID 1, and some PID 1s (this VM's, many containers') never reap: it may stay a zombie.
  const grandAfter = await waitFor('the grandchild to die', async () => {
    const stat = await proc.readStat(grandPid);
    return stat === null || stat.state === 'Z' || stat.state === 'X' ? { stat } : undefined;
  });
  t.ok(grandAfter.stat === null || grandAfter.stat.startTime === grandStat.startTime, 'gone, or its own zombie');
  t.same(entries, [], 'nothing was worth a warning');
});

t.test('fixture tree: stat cases a real machine cannot produce on demand', async (t) => {
  const stat = (s: Omit<ProcStat, 'session' | 'ppid' | 'cpuTicks'>) => statLine({ ppid: 1, session: s.pgrp, cpuTicks: 0, ...s });
  const root = t.testdir({
    '4242': { stat: stat({ pid: 4242, comm: 'evil) (name', state: 'R', pgrp: 4242, startTime: 1000 }) },
    '4243': { stat: stat({ pid: 4243, comm: 'llama-server', state: 'S', pgrp: 4243, startTime: 900 }) },
    '4244': { stat: stat({ pid: 4244, comm: 'llama-server', state: 'Z', pgrp: 4244, startTime: 800 }) },
    '4245': {},
    '4246': { stat: '4246 (truncated' },
  });
  const { log, lines: entries } = captureLog();
  const proc = createProcReader({ root, log });
  t.equal(proc.root, root);

  t.equal((await proc.readStat(4242))?.comm, 'evil) (name', 'comm with ") (" in it');
  t.same([(await proc.readStat(4243))?.startTime, (await proc.readStat(4243))?.state], [900, 'S'], 'start time and state, which attribution compares');
  t.equal((await proc.readStat(4244))?.state, 'Z', 'a zombie still has a stat');
  t.equal(await proc.readStat(4245), null, 'a PID directory whose stat vanished mid-read is gone');
  t.equal(await proc.readStat(99999), null, 'no such PID');
  t.same(entries, [], 'gone PIDs are not warnings');

  await t.rejects(proc.readStat(4246), { name: 'ProcParseError', message: /4246\/stat: malformed \/proc stat: no "\(command name\)"/ }, 'an existing PID with a malformed stat throws, naming the file');
  t.match(entries[0], { level: WARN, procPid: 4246, err: { message: /malformed/ } }, 'the malformed stat is logged at warn with pid and err');
});

t.test('fixture tree: listPids and findPidsInCgroup', async (t) => {
  const podUid = '7a4b5c9e-1234-4cde-8f00-0123456789ab';
  const podSystemd = podUid.replaceAll('-', '_');
  const containerId = '3f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8';
  const otherContainer = '9e8d7c6b5a4938271605f4e3d2c1b0a99e8d7c6b5a4938271605f4e3d2c1b0a9';
  const root = t.testdir({
    // cgroup v2, systemd driver: the pod UID is written with '_'
    '100': { cgroup: `0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod${podSystemd}.slice/cri-containerd-${containerId}.scope\n` },
    // cgroup v1, cgroupfs driver: the pod UID keeps its '-'
    '9': { cgroup: `12:memory:/kubepods/burstable/pod${podUid}/${otherContainer}\n11:cpu,cpuacct:/kubepods/burstable/pod${podUid}/${otherContainer}\n0::/\n` },
    '101': { cgroup: '0::/system.slice/docker-0123abcd.scope\n' },
    '102': { cgroup: '0::/user.slice/user-1000.slice/session-3.scope\n' },
    '103': {},
    self: { cgroup: `0::/kubepods/pod${podUid}/x\n` },
    '12ab': { cgroup: `0::/kubepods/pod${podUid}/x\n` },
    cpuinfo: 'processor : 0\n',
  });
  const { log, lines: entries } = captureLog();
  const proc = createProcReader({ root, log });

  t.same(await proc.listPids(), [9, 100, 101, 102, 103], 'numeric entries only, in numeric order');
  t.same(await proc.readCgroup(103), null, 'a process that vanished before its cgroup was read');
  t.same(await proc.findPidsInCgroup(podUid), [9, 100], 'a pod UID matches both cgroup drivers, and the scan survives a vanished entry');
  t.same(await proc.findPidsInCgroup(containerId), [100], 'a container id');
  t.same(await proc.findPidsInCgroup(otherContainer), [9], 'a container id on cgroup v1');
  t.same(await proc.findPidsInCgroup('no-such-pod'), [], 'no match');
  t.same(await proc.findPidsInCgroups([podUid, containerId]), new Map([[podUid, [9, 100]], [containerId, [100]]]), 'one scan answers several needles');
  t.same(await proc.findPidsInCgroups([]), new Map(), 'no needles, no scan');
  await t.rejects(proc.findPidsInCgroup(''), /empty one matches every process/, 'an empty needle is refused, not matched to everything');
  t.same(entries, []);

  const many = Object.fromEntries(Array.from({ length: 150 }, (_, i) => [String(i + 1), { cgroup: `0::/pod-${i % 2 === 0 ? 'even' : 'odd'}\n` }]));
  const big = createProcReader({ root: t.testdir(many), log });
  const even = await big.findPidsInCgroup('pod-even');
  t.equal(even.length, 75, 'a scan larger than one batch sees every process');
  t.ok(even.every((pid) => pid % 2 === 1), 'and keeps each answer with its own pid');
});

t.test('checkReadable: operator-friendly reasons', async (t) => {
  const { log } = captureLog();
  const check = (root: string) => createProcReader({ root, log }).checkReadable();
  const selfStat = statLine({ pid: 7, comm: 'node', state: 'R', ppid: 1, pgrp: 7, session: 7, startTime: 5, cpuTicks: 0 });

  t.same(await check(t.testdir({ self: { stat: selfStat } })), { ok: true }, 'self/stat readable');
  t.same(await check(t.testdir({ '7': { stat: selfStat } })), { ok: true }, 'no self (another PID namespace), but the root lists processes');

  const empty = await check(t.testdir({ sys: {} }));
  t.equal(empty.ok, false);
  t.match(empty, { reason: /self\/stat \(ENOENT\), and .* lists no processes, so it is not a proc filesystem\. .*hostPID: true/ }, 'an empty mount is not mistaken for a node without processes');

  const garbled = await check(t.testdir({ self: { stat: 'garbage' } }));
  t.match(garbled, { ok: false, reason: /cannot read .*self\/stat \(malformed \/proc stat: / }, 'an unparsable self/stat says so');

  const missing = await check('/nonexistent/host/proc');
  t.match(missing, { ok: false, reason: /cannot read \/nonexistent\/host\/proc\/self\/stat \(ENOENT\), and cannot list \/nonexistent\/host\/proc \(ENOENT\)\. Point the proc root setting/ });

  const file = await check(t.testdir({ 'not-a-dir': 'x' }) + '/not-a-dir');
  t.match(file, { ok: false, reason: /\(ENOTDIR\), and cannot list .*not-a-dir \(ENOTDIR\)/ }, 'a root that is a file');
});

// Permission and I/O errors cannot be made on demand when the tests run as root: fs is replaced.
// open fails at openSync, read at readSync (of a file opened for that path); open files are tracked
// so a test can check that every file opened was closed, failures included.
interface FailingFs {
  procfs: ProcfsModule;
  openNow: () => number;
  mostOpen: () => number;
}

async function withFailingFs(
  t: Test,
  fail: {
    open?: (path: string) => NodeJS.ErrnoException | undefined;
    read?: (path: string) => NodeJS.ErrnoException | undefined;
    readdir?: NodeJS.ErrnoException;
  },
): Promise<FailingFs> {
  const open = new Map<number, string>();
  let mostOpen = 0;
  const openSync = ((path: string, ...rest: unknown[]) => {
    const err = fail.open?.(path);
    if (err) throw err;
    const fd = (fs.openSync as (...a: unknown[]) => number)(path, ...rest);
    open.set(fd, path);
    mostOpen = Math.max(mostOpen, open.size);
    return fd;
  }) as typeof fs.openSync;
  const readSync = ((fd: number, ...rest: unknown[]) => {
    const err = fail.read?.(open.get(fd) as string);
    if (err) throw err;
    return (fs.readSync as (...a: unknown[]) => number)(fd, ...rest);
  }) as typeof fs.readSync;
  const closeSync = ((fd: number) => {
    open.delete(fd);
    fs.closeSync(fd);
  }) as typeof fs.closeSync;
  const readdir = (async (path: string) => {
    if (fail.readdir) throw fail.readdir;
    return fsPromises.readdir(path);
  }) as typeof Readdir;
  const procfs = await t.mockImport<ProcfsModule>('../../src/system/procfs.js', {
    'node:fs': { ...fs, openSync, readSync, closeSync },
    'node:fs/promises': { ...fsPromises, readdir },
  });
  return { procfs, openNow: () => open.size, mostOpen: () => mostOpen };
}

const pidOfPath = (path: string) => path.split('/').at(-2) as string;

t.test('errors other than "gone" are thrown clearly and logged at warn', async (t) => {
  const selfStat = statLine({ pid: 7, comm: 'node', state: 'R', ppid: 1, pgrp: 7, session: 7, startTime: 5, cpuTicks: 0 });
  const root = t.testdir({
    '7': { stat: selfStat, cgroup: '0::/a\n' },
    '8': { stat: selfStat, cgroup: '0::/a\n' },
    '9': { stat: selfStat, cgroup: '0::/a\n' },
  });
  // EACCES when opening; EIO, and ESRCH (the process exited between open and read), when reading.
  const failing = await withFailingFs(t, {
    open: (path) => (pidOfPath(path) === '7' ? errnoError('EACCES') : undefined),
    read: (path) => ({ '8': errnoError('EIO'), '9': errnoError('ESRCH') })[pidOfPath(path)],
  });
  const { log, lines: entries } = captureLog();
  const proc = failing.procfs.createProcReader({ root, log });

  await t.rejects(proc.readStat(7), { message: /7\/stat: permission denied \(EACCES\)\. The proc root .* is not readable by this process\. .*hostPID: true/, cause: { code: 'EACCES' } }, 'EACCES names the root and the fix');
  t.match(entries.at(-1), { level: WARN, procPid: 7, err: { code: 'EACCES' } }, 'EACCES logged with pid and err');
  await t.rejects(proc.readCgroup(7), /permission denied/, 'the same for cgroup');
  await t.rejects(proc.findPidsInCgroup('/a'), /permission denied/, 'a scan does not pass over an unreadable process as if it were not there');

  await t.rejects(proc.readStat(8), { message: /8\/stat: EIO: simulated/, cause: { code: 'EIO' } }, 'EIO is wrapped with the path');
  t.match(entries.at(-1), { level: WARN, procPid: 8, err: { code: 'EIO' } }, 'EIO logged with pid and err');

  const before = entries.length;
  t.equal(await proc.readStat(9), null, 'ESRCH (exited between open and read) is gone');
  t.equal(await proc.readCgroup(9), null);
  t.equal(entries.length, before, 'and not a warning');
  t.equal(failing.openNow(), 0, 'every file opened was closed, also when its read failed');
  t.equal(failing.mostOpen(), 1, 'one file open at a time');

  const denied = await withFailingFs(t, { open: () => errnoError('EACCES'), readdir: errnoError('EACCES') });
  const locked = denied.procfs.createProcReader({ root, log });
  await t.rejects(locked.listPids(), { message: /permission denied \(EACCES\)\. The proc root .* is not readable/ }, 'an unlistable root');
  t.match(entries.at(-1), { level: WARN, root, err: { code: 'EACCES' } }, 'logged with the root and err');
  t.match(await locked.checkReadable(), { ok: false, reason: /self\/stat \(EACCES\), and cannot list .* \(EACCES\)\. .*hostPID: true/ }, 'an unreadable root, for the doctor');
});

t.test('a file larger than the read buffer is read whole, and a later small file is not mixed with it', async (t) => {
  // Nested containers: one long cgroup path per v1 controller, about 10 KiB in all (the buffer starts at 4 KiB).
  const nested = Array.from({ length: 12 }, (_, i) => `/kubepods/burstable/pod${i}/${'c'.repeat(64)}/docker/${'d'.repeat(64)}/level-${i}`);
  const paths = Array.from({ length: 96 }, (_, i) => `${nested[i % nested.length]}/${String(i).padStart(3, '0')}`);
  const big = paths.map((path, i) => `${i + 1}:controller-${i}:${path}`).join('\n') + '\n';
  t.ok(big.length > 10_000, `the cgroup file is ${big.length} bytes`);
  const root = t.testdir({
    '300': { cgroup: big, stat: statLine({ pid: 300, comm: 'nested', state: 'S', ppid: 1, pgrp: 300, session: 300, startTime: 77, cpuTicks: 0 }) },
    '301': { cgroup: '0::/small\n' },
  });
  const { log, lines: entries } = captureLog();
  const proc = createProcReader({ root, log });
  t.same(await proc.readCgroup(300), paths, 'every line, the last one included');
  t.same(await proc.readCgroup(301), ['/small'], 'a small file read after it holds only its own bytes');
  t.equal((await proc.readStat(300))?.startTime, 77, 'and a stat after it parses');
  t.same(await proc.readCgroup(300), paths, 'read again with the grown buffer');
  t.same(await proc.findPidsInCgroup('level-11/095'), [300], 'the scan sees the end of the large file');
  t.same(entries, []);
});

/** `count` live `sleep` children, started, and killed when the test ends. */
async function sleepers(t: Test, count: number): Promise<ChildProcess[]> {
  const children = Array.from({ length: count }, () => spawn('sleep', ['60'], { stdio: 'ignore' }));
  t.teardown(() => {
    for (const child of children) child.kill('SIGKILL');
  });
  await Promise.all(children.map((child) => once(child, 'spawn')));
  return children;
}

t.test('readStats: real processes, each answer keyed to its own pid', async (t) => {
  const { log, lines: entries } = captureLog();
  const proc = createProcReader({ root: '/proc', log });
  const children = await sleepers(t, 5);
  const reaped = spawn('true', { stdio: 'ignore' });
  await once(reaped, 'exit');
  const gone = reaped.pid as number;

  const pids = [process.pid, ...children.map((child) => child.pid as number), gone];
  const stats = await proc.readStats(pids);
  t.same([...stats.keys()], pids, 'one entry per pid asked, in order');
  t.equal(readable(stats.get(process.pid))?.ppid, process.ppid, 'our own stat');
  for (const child of children) {
    const stat = readable(stats.get(child.pid as number));
    t.match(stat, { pid: child.pid, ppid: process.pid }, `child ${child.pid} is ours`);
    const again = await proc.readStat(child.pid as number);
    t.same([again?.pid, again?.startTime, again?.pgrp], [stat?.pid, stat?.startTime, stat?.pgrp], 'the same process as readStat finds (its state may move on)');
  }
  t.equal(stats.get(gone), null, 'a reaped child is gone');
  t.same(await proc.readStats([]), new Map(), 'no pids, no answers');
  t.same(entries, [], 'gone is not a warning');

  const all = await proc.listPids();
  const everyone = await proc.readStats(all);
  t.equal(everyone.size, all.length, `every process of this machine (${all.length}) answered`);
  t.ok([...everyone].every(([pid, stat]) => stat === null || stat.pid === pid), 'each stat is its own pid');
});

t.test('readStats keeps each stat open between snapshots, and lets go of what a snapshot no longer asks about', async (t) => {
  const openFds = () => fs.readdirSync('/proc/self/fd').length;
  // A process's identity; its state moves on its own (a child just spawned may still be running).
  const who = (stat: StatAnswer | undefined) => (isReadable(stat) ? [stat.pid, stat.startTime, stat.pgrp, stat.comm] : stat);
  const identities = (stats: Map<number, StatAnswer>) => [...stats].map(([pid, stat]) => [pid, who(stat)]);
  const proc = createProcReader({ root: '/proc', log: pino({ level: 'silent' }) });
  t.teardown(() => proc.release());
  const children = await sleepers(t, 4);
  const pids = children.map((child) => child.pid as number);
  const before = openFds();

  const first = await proc.readStats(pids, { keep: true });
  t.equal(openFds(), before + 4, 'one descriptor kept per process');
  const second = await proc.readStats(pids, { keep: true });
  t.same(identities(second), identities(first), 'read again through them: the same processes');
  t.equal(openFds(), before + 4, 'and no new descriptor');

  const killed = children[1]!;
  const exited = once(killed, 'exit');
  killed.kill('SIGKILL');
  await exited;
  const third = await proc.readStats(pids, { keep: true });
  t.equal(third.get(killed.pid as number), null, 'a reaped process reads as gone through its kept descriptor');
  t.same(who(third.get(pids[0]!)), who(first.get(pids[0]!)), 'the others are unchanged');
  t.equal(openFds(), before + 3, "the reaped process's descriptor is closed");

  await proc.readStats([pids[2]!]);
  t.equal(openFds(), before + 3, "a read that does not keep (the doctor's) opens nothing and lets go of nothing");
  t.same(who(proc.statNow(pids[0]!)), who(first.get(pids[0]!)), "statNow reads through the descriptor kept (a probe's read)");
  t.equal(proc.statNow(killed.pid as number), null, 'and a reaped process as gone');
  t.equal(openFds(), before + 3, 'opening nothing new for the kept ones');
  await proc.readStats([pids[0]!], { keep: true });
  t.equal(openFds(), before + 1, 'PIDs a snapshot no longer asks about are let go');
  proc.release();
  t.equal(openFds(), before, 'release() closes the rest');
  t.same(who((await proc.readStats([pids[0]!], { keep: true })).get(pids[0]!)), who(first.get(pids[0]!)), 'a released reader still reads');
  t.equal(openFds(), before, 'but keeps nothing open any more (a refresh still running at shutdown leaks nothing)');

  const capped = createProcReader({ root: '/proc', log: pino({ level: 'silent' }), keepMax: 2 });
  const live = [pids[0]!, pids[2]!, pids[3]!];
  const cappedStats = await capped.readStats(live, { keep: true });
  t.same([...cappedStats.values()].map(who), live.map((pid) => who(first.get(pid))), 'past keepMax, processes are read afresh');
  t.equal(openFds(), before + 2, 'with at most keepMax descriptors kept');
  capped.release();

  const fixture = createProcReader({ root: t.testdir({ '7': { stat: statLine({ pid: 7, comm: 'x', state: 'S', ppid: 1, pgrp: 7, session: 7, startTime: 5, cpuTicks: 0 }) } }), log: pino({ level: 'silent' }) });
  t.equal(readable((await fixture.readStats([7], { keep: true })).get(7))?.startTime, 5);
  t.equal(openFds(), before, 'a tree of plain files is not /proc: nothing is kept (a deleted entry must read as gone)');
  const slash = createProcReader({ root: '/proc/', log: pino({ level: 'silent' }) });
  t.equal((await slash.readStat(process.pid))?.pid, process.pid, 'a root given with a trailing slash reads the same paths');
});

t.test('parseOpenFilesLimit: the soft limit of a /proc/PID/limits file', async (t) => {
  const own = parseOpenFilesLimit(fs.readFileSync('/proc/self/limits', 'utf8'));
  t.ok(own !== null && Number.isInteger(own) && own > 0, `this process's: ${own}`);
  const limits = (soft: string, hard: string) =>
    'Limit                     Soft Limit           Hard Limit           Units     \n' +
    'Max processes             96365                96365                processes \n' +
    `Max open files            ${soft.padEnd(21)}${hard.padEnd(21)}files     \n` +
    'Max locked memory         8388608              8388608              bytes     \n';
  t.equal(parseOpenFilesLimit(limits('1024', '4096')), 1024, 'the soft one');
  t.equal(parseOpenFilesLimit(limits('unlimited', 'unlimited')), null);
  t.equal(parseOpenFilesLimit('Max processes 10 10 processes\n'), null, 'no open-files line');
});

t.test('readStats keeps at most half of the open-file limit, so the rest of the service has descriptors', async (t) => {
  const openFds = () => fs.readdirSync('/proc/self/fd').length;
  const readers: Array<{ release: () => void }> = [];
  t.teardown(() => {
    for (const reader of readers) reader.release();
  });
  const pids = (await sleepers(t, 8)).map((child) => child.pid as number);
  const dir = t.testdir({
    low: 'Limit Soft Limit Hard Limit Units\nMax open files            10                   4096                 files     \n',
    unlimited: 'Max open files            unlimited            unlimited            files     \n',
  });
  const kept = async (options: { keepMax?: number; limitsFile?: string }) => {
    const reader = createProcReader({ root: '/proc', log: pino({ level: 'silent' }), ...options });
    readers.push(reader);
    const before = openFds();
    const stats = await reader.readStats(pids, { keep: true });
    t.same([...stats.values()].map((stat) => stat?.pid), pids, 'every process read');
    const count = openFds() - before;
    reader.release();
    return count;
  };
  t.equal(await kept({ limitsFile: `${dir}/low` }), 5, 'a soft limit of 10: 5 kept');
  t.equal(await kept({ limitsFile: `${dir}/low`, keepMax: 3 }), 3, 'keepMax when it is lower');
  t.equal(await kept({ limitsFile: `${dir}/unlimited` }), 8, 'unlimited: no cap');
  t.equal(await kept({ limitsFile: `${dir}/missing` }), 8, 'no limits file: no cap');
  t.equal(await kept({}), 8, "this process's own limit is far above 16");
});

t.test('readStats: out of descriptors while keeping, it gives half back and reads every process', async (t) => {
  // The descriptor limit, simulated: an open fails while `limit` files are open.
  let limit = 10;
  let refusal = 'EMFILE';
  const { log, lines: entries } = captureLog();
  const failing: FailingFs = await withFailingFs(t, { open: () => (failing.openNow() >= limit ? errnoError(refusal) : undefined) });
  const proc = failing.procfs.createProcReader({ root: '/proc', log });
  t.teardown(() => proc.release());
  const pids = (await sleepers(t, 30)).map((child) => child.pid as number);
  const read = async () => [...(await proc.readStats(pids, { keep: true })).values()].map((stat) => stat?.pid);

  t.same(await read(), pids, 'every process read, none taken for absent');
  t.equal(failing.openNow(), 5, 'half of the 10 kept when the limit was hit are kept');
  t.equal(entries.length, 1, 'one warning');
  t.match(entries[0], { level: WARN, keepLimit: 5, err: { code: 'EMFILE' }, msg: /^Out of file descriptors \(EMFILE\).*at most 5 are kept.*nofile/ });
  t.equal(proc.keeping().keepLimit, 5, 'keeping() says so too (the doctor reports it)');
  t.same(await read(), pids, 'the next snapshot reads them all again');
  t.equal(failing.openNow(), 5, 'keeping the same 5');
  t.equal(entries.length, 1, 'without a new warning');

  // Something else takes descriptors: even a read afresh (open, read, close) is refused now.
  limit = 5;
  refusal = 'ENFILE';
  t.same(await read(), pids, 'still every process');
  t.equal(failing.openNow(), 2, 'half again');
  t.match(entries[1], { level: WARN, keepLimit: 2, err: { code: 'ENFILE' }, msg: /^Out of file descriptors \(ENFILE\).*at most 2 are kept.*whole host.*fs\.file-max/ });
  proc.release();
  t.equal(failing.openNow(), 0, 'release() still closes what is kept');
});

t.test('readStats: out of descriptors with none kept, a process cannot be read and keeping resumes later', async (t) => {
  let limit = 0;
  let refusal = 'EMFILE';
  const { log, lines: entries } = captureLog();
  const failing: FailingFs = await withFailingFs(t, { open: () => (failing.openNow() >= limit ? errnoError(refusal) : undefined) });
  const proc = failing.procfs.createProcReader({ root: '/proc', log });
  t.teardown(() => proc.release());
  const pid = (await sleepers(t, 1))[0]!.pid as number;

  t.match(
    (await proc.readStats([pid], { keep: true })).get(pid),
    { pid, unreadable: 'nodecompute is out of file descriptors (EMFILE)', advice: /open-file limit \(nofile/ },
    'no descriptor to read it with: unreadable in this answer, not gone',
  );
  t.match(entries, [{ level: WARN, err: { message: /EMFILE/ }, msg: /could not read or parse the \/proc stat of 1 existing process/ }], 'the usual read failure, not the keeping one');
  refusal = 'ENFILE';
  t.match(
    (await proc.readStats([pid], { keep: true })).get(pid),
    { pid, unreadable: 'the host is out of file descriptors (ENFILE)', advice: /fs\.file-max/ },
    'the whole host out of descriptors: said so',
  );
  limit = 10;
  t.equal((await proc.readStats([pid], { keep: true })).get(pid)?.pid, pid, 'read once descriptors are free');
  t.equal(failing.openNow(), 1, 'and kept: nothing was given up for a failure that keeping did not cause');
});

t.test('readStats under a real descriptor limit (ulimit -n) reads every process and leaves half the limit free', async (t) => {
  // The built module in a child whose hard limit is low: Node cannot raise it. 64 descriptors: Node
  // with pino takes about 20, under tap about 25; keeping takes at most 32.
  const pids = (await sleepers(t, 100)).map((child) => child.pid as number);
  const script = `
    const { readdirSync } = await import('node:fs');
    const { pino } = await import('pino');
    const { createProcReader } = await import(${JSON.stringify(fileURLToPath(new URL('../../dist/src/system/procfs.js', import.meta.url)))});
    const warnings = [];
    const proc = createProcReader({ root: '/proc', log: pino({ level: 'warn' }, { write: (line) => warnings.push(JSON.parse(line).msg) }) });
    const pids = ${JSON.stringify(pids)};
    const before = readdirSync('/proc/self/fd').length;
    const answered = [];
    for (let i = 0; i < 2; i += 1) answered.push([...(await proc.readStats(pids, { keep: true })).values()].filter((stat) => stat !== null).length);
    console.log(JSON.stringify({ answered, kept: readdirSync('/proc/self/fd').length - before, warnings }));
  `;
  const { stdout } = await promisify(execFile)('bash', ['-c', 'ulimit -n 64 && exec "$0" --input-type=module --eval "$1"', process.execPath, script], {
    cwd: fileURLToPath(new URL('../..', import.meta.url)),
  });
  const result = JSON.parse(stdout) as { answered: number[]; kept: number; warnings: string[] };
  t.same(result.answered, [100, 100], 'all 100 processes, in both snapshots');
  t.equal(result.kept, 32, 'half of the limit kept open, the other half left to the service');
  t.same(result.warnings, [], 'and never out of descriptors');
});

t.test('readStats: present, gone, malformed and unreadable entries; one warning per call', async (t) => {
  const stat = (pid: number, startTime: number) => statLine({ pid, comm: `p${pid}`, state: 'S', ppid: 1, pgrp: pid, session: pid, startTime, cpuTicks: 0 });
  const root = t.testdir({
    '10': { stat: stat(10, 100) },
    '11': {},
    '12': { stat: '12 (truncated' },
    '13': { stat: stat(13, 130) },
    '14': { stat: stat(14, 140) },
    '15': { stat: stat(15, 150) },
    '16': { stat: stat(16, 160) },
    '17': { stat: stat(17, 170) },
  });
  const failing = await withFailingFs(t, {
    open: (path) => (pidOfPath(path) === '13' ? errnoError('EACCES') : undefined),
    read: (path) => ({ '14': errnoError('EIO'), '15': errnoError('ESRCH'), '17': new Error('a fault without an errno') })[pidOfPath(path)],
  });
  const { log, lines: entries } = captureLog();
  const proc = failing.procfs.createProcReader({ root, log });

  const stats = await proc.readStats([10, 11, 12, 13, 14, 15, 16, 17, 99999]);
  const answer = (s: StatAnswer) => (s === null ? null : isReadable(s) ? s.startTime : s.unreadable);
  t.same(
    [...stats].map(([pid, s]) => [pid, answer(s)]),
    [
      [10, 100],
      [11, null],
      [12, 'its stat does not parse'],
      [13, `permission denied (EACCES) under ${root}`],
      [14, 'reading it failed (EIO)'],
      [15, null],
      [16, 160],
      [17, `reading it failed (cannot read ${root}/17/stat: a fault without an errno)`],
      [99999, null],
    ],
    'present entries answer; gone ones (ENOENT, ESRCH) are null; malformed, denied and I/O-failed ones say what failed, never null',
  );
  t.match(stats.get(12), { pid: 12, advice: /log quotes the line.*uname -r/ }, 'a malformed stat: where to find it');
  t.match(stats.get(13), { pid: 13, advice: /hostPID: true/ }, 'denied: the deployment to change');
  t.match(stats.get(14), { pid: 14, advice: /dmesg/ }, 'an I/O error: where to look');
  t.equal(entries.length, 1, 'one warning for the whole call, not one per pid');
  t.match(
    entries[0],
    { level: WARN, failed: 4, procPid: 12, err: { type: 'ProcParseError', message: /12\/stat: malformed/ }, msg: /4 existing process.*does not mean that they exited.*uname -r/ },
    'with the count, the first error and its advice',
  );
  t.equal(failing.openNow(), 0, 'every file opened was closed');

  entries.length = 0;
  t.same([...(await proc.readStats([10, 11, 15]))].map(([pid, s]) => [pid, s?.pid ?? null]), [[10, 10], [11, null], [15, null]], 'present and gone only');
  t.same(entries, [], 'gone entries alone are not worth a warning');
  await t.rejects(proc.readStat(13), /permission denied/, 'readStat of the same entry still throws: only readStats answers instead');

  entries.length = 0;
  t.same(
    [10, 11, 12, 13, 15, 99999].map((pid) => answer(proc.statNow(pid))),
    [100, null, 'its stat does not parse', `permission denied (EACCES) under ${root}`, null, null],
    'statNow answers each as readStats does, at once',
  );
  t.same(entries, [], 'and logs nothing: a probe reads it, and the next snapshot says what failed');
  t.equal(failing.openNow(), 0, 'every file opened was closed');
});

t.test('readStats: more pids than one batch, yielding between batches', async (t) => {
  const count = 150;
  const tree = Object.fromEntries(
    Array.from({ length: count }, (_, i) => {
      const pid = 1000 + i;
      return [String(pid), { stat: statLine({ pid, comm: `w${i}`, state: 'S', ppid: 1, pgrp: pid, session: pid, startTime: 5000 + i, cpuTicks: 0 }) }];
    }),
  );
  const { log, lines: entries } = captureLog();
  const failing = await withFailingFs(t, {});
  const proc = failing.procfs.createProcReader({ root: t.testdir(tree), log });
  // Shuffled, with gone pids among them, so that an answer given to its neighbour would show.
  const pids = fc.sample(fc.shuffledSubarray([...Array.from({ length: count }, (_, i) => 1000 + i), 1, 2, 3], { minLength: count + 3 }), { numRuns: 1, seed: 42 })[0] as number[];

  let yielded = 0;
  const ticker = () => {
    yielded += 1;
    if (yielded < 100) setImmediate(ticker);
  };
  setImmediate(ticker);
  const stats = await proc.readStats(pids);
  t.same([...stats.keys()], pids, 'every pid answered, in the order asked');
  for (const pid of pids) {
    const want = pid >= 1000 ? { pid, comm: `w${pid - 1000}`, startTime: 5000 + pid - 1000 } : null;
    const got = readable(stats.get(pid));
    if (want === null ? stats.get(pid) !== null : !isDeepStrictEqual({ pid: got?.pid, comm: got?.comm, startTime: got?.startTime }, want)) {
      t.fail(`pid ${pid} got another's answer: ${JSON.stringify(stats.get(pid))}`);
    }
  }
  t.pass('each answer is its own pid\'s');
  t.ok(yielded >= 2, `the event loop ran between the ${Math.ceil(pids.length / 64)} batches (${yielded} turns)`);
  t.equal(failing.mostOpen(), 1, 'one file open at a time');
  t.same(entries, []);

  yielded = 0;
  setImmediate(() => void (yielded += 1));
  await proc.readStats(pids.slice(0, 64));
  t.equal(yielded, 0, 'a single batch does not yield');
});
