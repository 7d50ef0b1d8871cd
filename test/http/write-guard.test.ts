// Which writes a browser could have sent on a page's behalf, by their headers alone.
import t from 'tap';
import { browserRefusal, hostnameOf } from '../../src/http/write-guard.js';

t.test('host names without port, brackets or case', async (t) => {
  t.equal(hostnameOf('LocalHost:9470'), 'localhost');
  t.equal(hostnameOf('[::1]:9470'), '::1');
  t.equal(hostnameOf('127.0.0.1'), '127.0.0.1');
  t.equal(hostnameOf(' gpu-node-7 '), 'gpu-node-7');
});

t.test('refused or not, and why', async (t) => {
  const cases: Array<[string, Parameters<typeof browserRefusal>[0], boolean, string | null]> = [
    ['curl to localhost', { host: 'localhost:9470' }, true, null],
    ['curl to [::1]', { host: '[::1]:9470' }, true, null],
    ['curl to another 127/8 address', { host: '127.0.0.2' }, true, null],
    ['HTTP/1.0 without Host', {}, true, null],
    ['a listed name', { host: 'gpu-node-7' }, true, null],
    ['a rebound name', { host: 'rebind.attacker.example:9470' }, true, 'foreign-host'],
    ['a rebound name, with a token in force', { host: 'rebind.attacker.example:9470' }, false, null],
    ['its own origin', { host: '127.0.0.1:9470', origin: 'http://127.0.0.1:9470' }, true, null],
    ['another port', { host: '127.0.0.1:9470', origin: 'http://127.0.0.1:8080' }, true, 'cross-origin'],
    ['another site', { host: 'localhost:9470', origin: 'http://attacker.example' }, false, 'cross-origin'],
    ['a sandboxed frame or a file: page', { host: 'localhost:9470', origin: 'null' }, true, 'cross-origin'],
    ['an Origin but no Host', { origin: 'http://localhost:9470' }, true, 'cross-origin'],
    ['Sec-Fetch-Site cross-site', { host: 'localhost', 'sec-fetch-site': 'cross-site' }, true, 'cross-origin'],
    ['Sec-Fetch-Site same-site', { host: 'localhost', 'sec-fetch-site': 'same-site' }, true, 'cross-origin'],
    ['Sec-Fetch-Site same-origin', { host: 'localhost', 'sec-fetch-site': 'same-origin' }, true, null],
    ['Sec-Fetch-Site none (typed by the user)', { host: 'localhost', 'sec-fetch-site': 'none' }, true, null],
  ];
  for (const [name, headers, loopbackTrust, reason] of cases) {
    const refusal = browserRefusal(headers, loopbackTrust, ['gpu-node-7']);
    t.equal(refusal?.reason ?? null, reason, name);
    if (refusal) t.equal(refusal.error.statusCode, 403, `${name}: 403`);
  }
});
