'use strict';
/*
 * FrogFix's preload for JavaScript test runners, run inside the sandbox by every verification run
 * (NODE_OPTIONS=--require, so it loads wherever node starts; never imported by FrogFix itself).
 *
 * Why it exists: the code under review runs inside the test process and can rewrite what a runner
 * prints or returns. This preload sends each result out of the process as it happens, on the results
 * channel the sandbox runner reads (FROGFIX_RESULTS_FD), the way worker/attempts/evidence_plugin.py does
 * for pytest; worker/attempts/run_checks.py reads the lines. It takes the channel out of the environment
 * in every node process at once (node's child_process never passes the descriptor on), and acts only
 * in a runner's own main process: jest (a reporter added to the configuration it read, nothing to argv),
 * vitest (a reporter named on its command line, the default kept), mocha (listeners on its runner, and
 * FrogFix's sentinel tests in the root suite), `node --test` (started again with a reporter added).
 * Anything going wrong here stays silent: the run then carries nothing and is judged by exit codes.
 */
const fs = require('fs');
const path = require('path');
const Module = require('module');

// What sending uses, taken before any project code runs: a test that patches fs or JSON later changes nothing here.
const writeSync = fs.writeSync;
const stringify = JSON.stringify;
const assign = Object.assign;
const bufferFrom = Buffer.from.bind(Buffer);
const subarray = Uint8Array.prototype.subarray;
const SENTINELS = {}; // name -> "pass" or "fail"; filled in per run (worker/attempts/js_runners.py reporter_files)
const REEXEC = 'FROGFIX_NODE_TEST_REEXEC';
const state = { fd: null, n: 0, ended: false, started: false, root: '' };

function repositoryRoot() {
  /* Test ids are relative to the checkout's root (where .git is), also for `cd pkg && jest`; else the cwd. */
  const cwd = process.cwd();
  for (let folder = cwd; ; folder = path.dirname(folder)) {
    if (fs.existsSync(path.join(folder, '.git'))) return folder;
    if (path.dirname(folder) === folder) return cwd;
  }
}

function takeChannel() {
  const value = process.env.FROGFIX_RESULTS_FD;
  delete process.env.FROGFIX_RESULTS_FD;
  const fd = Number(value);
  // No fstat of it here: in Node 20, an fstat from a preload breaks vite's ESM import of CommonJS packages
  // (picomatch's default export came out as {}: vitest 4 on ufo). A descriptor that is not open fails the first
  // write instead, and the run then carries nothing.
  if (!value || !Number.isInteger(fd) || fd < 3) return null;
  return fd;
}

function send(kind, fields) {
  if (state.fd === null || state.ended) return;
  state.n += 1;
  let data = bufferFrom(stringify(assign({ k: kind, n: state.n }, fields)) + '\n');
  try {
    while (data.length) data = subarray.call(data, writeSync(state.fd, data));
  } catch (e) {
    state.fd = null; // the channel is gone: the host sees the stream end early
  }
  if (kind === 'end') state.ended = true;
}

function start(runner, version) {
  if (state.started) return false;
  state.started = true;
  send('start', { runner: runner, version: String(version || '?'), pid: process.pid });
  return true;
}

function relative(file) {
  const rel = path.relative(state.root, String(file || ''));
  return rel.split(path.sep).join('/');
}

function testId(file, titles) {
  return relative(file) + '::' + titles.filter((t) => t !== '' && t != null).join(' > ');
}

function loadFailure(file) {
  return relative(file) + '::<file failed to run>';
}

/* The channel, once, for a reporter module of this folder loaded by the runner (jest, vitest, node --test). */
let lent = false;
function takeSender() {
  if (lent || state.fd === null) return null;
  lent = true;
  return { send: send, start: start, testId: testId, loadFailure: loadFailure };
}

function runnerOf(script) {
  if (process.execArgv.includes('--test')) return process.env.NODE_TEST_CONTEXT ? '' : 'node-test';
  let real = '';
  try {
    real = script ? fs.realpathSync(script) : '';
  } catch (e) {
    return '';
  }
  const p = real.split(path.sep).join('/');
  if (/\/(jest|jest-cli)\/bin\/jest(\.js)?$/.test(p)) return 'jest';
  if (/\/vitest\/vitest\.mjs$/.test(p)) return 'vitest';
  if (/\/mocha\/bin\/(mocha|_mocha)(\.js)?$/.test(p) || /\/mocha\/lib\/cli\/cli\.js$/.test(p)) return 'mocha';
  return '';
}

/* ---- jest: its own reporter option, added to the configuration jest read (never to argv), and the
   end status from runCLI. The reporter module (jest-reporter.cjs) takes the channel from here. ---- */

function withReporter(read) {
  const config = read && read.globalConfig;
  if (!config || !state.jest || state.jest.configured) return read;
  state.jest.configured = true;
  const reporters = [...(config.reporters || [['default', {}]]), [path.join(__dirname, 'jest-reporter.cjs'), {}]];
  return assign({}, read, { globalConfig: assign({}, config, { reporters: reporters }) });
}

function wrapConfig(jestConfig) {
  const readConfigs = jestConfig.readConfigs;
  const wrapped = async function () {
    return withReporter(await readConfigs.apply(this, arguments));
  };
  return Object.create(jestConfig, { readConfigs: { value: wrapped, enumerable: true } });
}

function wrapCore(core) {
  const runCLI = core.runCLI;
  const version = typeof core.getVersion === 'function' ? core.getVersion() : '?';
  const wrapped = async function (argv, projects) {
    if (state.jest) return runCLI.call(this, argv, projects); // one session per process
    state.jest = { configured: false, version: version };
    const out = await runCLI.call(this, argv, projects);
    if (!state.started) return out; // FrogFix's reporter never ran: no result is claimed, exit codes judge
    const results = out && out.results;
    const code = !results || results.success ? 0 : out.globalConfig.testFailureExitCode;
    send('planted', { names: [], why: 'jest has no way to add a test to a run' });
    send('end', { exitstatus: code, stopped: Boolean(results && results.wasInterrupted) });
    return out;
  };
  return Object.create(core, { runCLI: { value: wrapped, enumerable: true } });
}

function hookJest() {
  const load = Module._load;
  const wrapped = new Map();
  Module._load = function (request, parent) {
    const loaded = load.apply(this, arguments);
    const from = (parent && parent.filename ? parent.filename : '').split(path.sep).join('/');
    try {
      let make = null;
      if (request === '@jest/core' && /\/jest-cli\//.test(from) && loaded && typeof loaded.runCLI === 'function') {
        make = wrapCore;
      } else if (request === 'jest-config' && /\/@jest\/core\//.test(from) && loaded && loaded.readConfigs) {
        make = wrapConfig;
      }
      if (make === null) return loaded;
      if (!wrapped.has(loaded)) wrapped.set(loaded, make(loaded));
      return wrapped.get(loaded);
    } catch (e) {
      state.fd = null; // never in the runner's way: the run is judged by exit codes
      return loaded;
    }
  };
}

/* ---- vitest: its own reporter option, given before the CLI parses, with the default kept ---- */

function writable(folder) {
  try {
    fs.accessSync(folder, fs.constants.W_OK);
    return true;
  } catch (e) {
    return e.code === 'ENOENT';
  }
}

function atLeast(version, major, minor) {
  const [a, b] = String(version).split('.').map(Number);
  return a > major || (a === major && b >= minor);
}

function hookVitest(script) {
  const argv = process.argv;
  // A job's node_modules is read-only: vite's default config loader writes the bundled config there
  // (node_modules/.vite-temp) and fails; its module-runner loader (vitest 3.1 on) writes nothing.
  let version = '0';
  try {
    version = JSON.parse(fs.readFileSync(path.join(path.dirname(fs.realpathSync(script)), 'package.json'), 'utf8')).version;
  } catch (e) {
    version = '0';
  }
  const chosen = argv.some((a) => a === '--configLoader' || a.startsWith('--configLoader='));
  if (!chosen && atLeast(version, 3, 1) && !writable(path.join(process.cwd(), 'node_modules'))) {
    argv.push('--configLoader', 'runner');
  }
  if (argv.some((a) => a === '--reporter' || a.startsWith('--reporter='))) {
    argv.push('--reporter=' + path.join(__dirname, 'vitest-reporter.mjs'));
  } else {
    argv.push('--reporter=default', '--reporter=' + path.join(__dirname, 'vitest-reporter.mjs'));
  }
}

/* ---- mocha: listeners on the runner, sentinels in the root suite, hidden from its reporter ---- */

function mochaVersion(dir) {
  try {
    return JSON.parse(fs.readFileSync(path.join(dir, 'package.json'), 'utf8')).version;
  } catch (e) {
    return '?';
  }
}

function mochaId(runnable) {
  const titles = typeof runnable.titlePath === 'function' ? runnable.titlePath() : [runnable.title];
  let file = runnable.file;
  for (let p = runnable.parent; !file && p; p = p.parent) file = p.file;
  return testId(file, titles);
}

function plantMocha(runner, root, dir) {
  const names = Object.keys(SENTINELS);
  if (!names.length) return null;
  let why = '';
  if (root.bail && root.bail()) why = 'the run bails at its first failure';
  else if (root.hasOnly && root.hasOnly()) why = '.only limits the run';
  else if (runner._grep && String(runner._grep) !== '/.*/') why = 'a --grep or --fgrep selects the tests';
  else if (!root.total()) why = 'no test was collected';
  else if (typeof runner.runSuite !== 'function' || runner.constructor.name !== 'Runner') why = 'mocha runs in parallel';
  if (why) {
    send('planted', { names: [], why: why });
    return null;
  }
  const Test = require(path.join(dir, 'lib', 'test.js'));
  const Suite = require(path.join(dir, 'lib', 'suite.js'));
  const made = new Map();
  const half = Math.floor(names.length / 2);
  const tail = Suite.create(root, 'FrogFix');
  names.forEach((name, i) => {
    const expect = SENTINELS[name];
    const test = new Test(name, function () {
      if (expect === 'fail') throw new Error('FrogFix sentinel: this check fails on purpose');
    });
    made.set(test, name);
    if (i < half) {
      root.addTest(test);
      root.tests.splice(i, 0, root.tests.pop());
    } else {
      tail.addTest(test);
    }
  });
  send('planted', { names: names });
  return { made: made, tail: tail };
}

function listenMocha(runner, dir) {
  const planted = plantMocha(runner, runner.suite, dir);
  const emit = runner.emit;
  let stopped = false;
  runner.emit = function (event, item) {
    if (planted && item && planted.made.has(item)) {
      const outcome = { pass: 'passed', fail: 'failed', pending: 'skipped' }[event];
      if (outcome) send('sentinel', { name: planted.made.get(item), outcome: outcome });
      if (event === 'fail') this.failures -= 1; // FrogFix's own check counts nowhere the user looks
      return true;
    }
    if (planted && item === planted.tail) return true;
    if (event === 'pass' || event === 'pending') {
      send('case', { id: mochaId(item), outcome: event === 'pass' ? 'passed' : 'skipped' });
    } else if (event === 'fail' && item) {
      if (item.type === 'hook') stopped = true;
      const current = item.type === 'hook' && item.ctx && item.ctx.currentTest;
      send('case', { id: mochaId(current || item), outcome: 'failed' });
    } else if (event === 'end') {
      send('end', { exitstatus: Math.min(this.failures, 255), stopped: stopped || Boolean(this._abort) });
    }
    return emit.apply(this, arguments);
  };
}

function hookMocha() {
  const load = Module._load;
  let done = false;
  Module._load = function (request, parent) {
    const loaded = load.apply(this, arguments);
    if (done || !loaded || typeof loaded !== 'function' || !loaded.Runner || !loaded.Suite) return loaded;
    const proto = loaded.Runner.prototype;
    if (typeof proto.run !== 'function' || !/mocha/.test(request)) return loaded;
    done = true;
    const dir = path.dirname(path.dirname(Module._resolveFilename(request, parent)));
    const run = proto.run;
    proto.run = function () {
      if (start('mocha', mochaVersion(dir))) listenMocha(this, dir);
      return run.apply(this, arguments);
    };
    watchMochaFiles(loaded.prototype, dir);
    return loaded;
  };
}

function watchMochaFiles(proto, dir) {
  /* A file that fails to load ends mocha before any test runs: that file is the run's one result. */
  for (const name of ['loadFiles', 'loadFilesAsync']) {
    const load = proto[name];
    if (typeof load !== 'function') continue;
    proto[name] = function () {
      let current = null;
      this.suite.on('pre-require', (context, file) => (current = file));
      this.suite.on('post-require', () => (current = null));
      const fail = (err) => {
        if (current && start('mocha', mochaVersion(dir))) {
          send('case', { id: loadFailure(current), outcome: 'failed' });
          send('end', { exitstatus: 1, stopped: true });
        }
        throw err;
      };
      try {
        const out = load.apply(this, arguments);
        return out && typeof out.then === 'function' ? out.catch(fail) : out;
      } catch (err) {
        return fail(err);
      }
    };
  }
}

/* ---- node --test: started again with FrogFix's reporter beside spec, the channel passed on explicitly ---- */

function reexecNodeTest() {
  const args = process.execArgv.slice();
  const reporters = args.filter((a) => a.startsWith('--test-reporter=') || a === '--test-reporter').length;
  const destinations = args.filter((a) => a.startsWith('--test-reporter-destination')).length;
  if (reporters === 0 && destinations === 0) args.push('--test-reporter=spec', '--test-reporter-destination=stdout');
  else if (reporters === 1 && destinations === 0) args.push('--test-reporter-destination=stdout');
  else if (reporters !== destinations) return; // node refuses this itself
  args.push('--test-reporter=' + path.join(__dirname, 'node-test-reporter.mjs'), '--test-reporter-destination=/dev/null');
  const env = Object.assign({}, process.env, { FROGFIX_RESULTS_FD: '3' });
  env[REEXEC] = '1';
  const { spawnSync } = require('child_process');
  const done = spawnSync(process.execPath, [...args, ...process.argv.slice(1)], {
    stdio: ['inherit', 'inherit', 'inherit', state.fd],
    env: env,
  });
  if (done.signal) process.kill(process.pid, done.signal);
  process.exit(done.status === null ? 1 : done.status);
}

function main() {
  const again = process.env[REEXEC] === '1';
  delete process.env[REEXEC];
  const fd = takeChannel();
  const runner = runnerOf(process.argv[1]);
  if (fd === null || !runner) return;
  state.fd = fd;
  state.root = repositoryRoot();
  lent = runner === 'mocha'; // only jest's, vitest's and node's reporter modules take the channel
  if (runner === 'jest') hookJest();
  else if (runner === 'vitest') hookVitest(process.argv[1]);
  else if (runner === 'mocha') hookMocha();
  else if (runner === 'node-test' && !again) reexecNodeTest();
}

try {
  main();
} catch (e) {
  state.fd = null;
}

module.exports = { takeSender: takeSender, jestVersion: () => (state.jest ? state.jest.version : '?') };
