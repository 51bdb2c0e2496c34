/*
 * FrogFix's vitest reporter (named on vitest's command line by hook.cjs, beside the default one):
 * each test module's results go out on the results channel as the module ends, and the run's own
 * verdict at its end (vitest exits 1 unless the run passed). The channel comes from hook.cjs, once.
 */
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

function outcome(state) {
  return state === 'passed' ? 'passed' : state === 'failed' ? 'failed' : 'skipped';
}

function titles(test) {
  const names = [test.name];
  for (let p = test.parent; p && p.type === 'suite'; p = p.parent) names.unshift(p.name);
  return names;
}

function collect(task, names, found) {
  for (const child of task.tasks || []) {
    if (child.type === 'suite') collect(child, [...names, child.name], found);
    else found.push([[...names, child.name], child]);
  }
}

export default class FrogFixReporter {
  constructor() {
    this.channel = require('./hook.cjs').takeSender();
    this.seen = new Set();
  }

  onInit(vitest) {
    this.version = vitest && vitest.version;
    this.legacy = Number(String(this.version || '0').split('.')[0]) < 3; // no module or run-end hooks before 3
  }

  started() {
    /* The session starts with the first result: a vitest that never calls these claims nothing. */
    if (this.channel) this.channel.start('vitest', this.version);
    return this.channel;
  }

  onFinished(files, errors) {
    /* Vitest 1 and 2: every file's tasks at the end of the run (the only point their API gives them all). */
    const channel = this.legacy ? this.started() : null;
    if (!channel) return;
    let failed = (errors || []).length > 0;
    for (const file of files || []) {
      const found = [];
      collect(file, [], found);
      for (const [names, task] of found) {
        const state = task.mode === 'skip' || task.mode === 'todo' ? 'skip' : task.result && task.result.state;
        const outcome = state === 'pass' ? 'passed' : state === 'fail' ? 'failed' : 'skipped';
        failed = failed || outcome === 'failed';
        channel.send('case', { id: channel.testId(file.filepath, names), outcome: outcome });
      }
      if (file.result && file.result.state === 'fail' && (file.result.errors || []).length) {
        failed = true;
        channel.send('case', { id: channel.loadFailure(file.filepath), outcome: 'failed' });
      }
    }
    channel.send('planted', { names: [], why: 'vitest has no way to add a test to a run' });
    channel.send('end', { exitstatus: failed ? 1 : 0, stopped: false });
  }

  onTestModuleEnd(module, ended) {
    const channel = this.started();
    if (!channel || this.seen.has(module)) return;
    this.seen.add(module);
    const file = module.moduleId;
    let count = 0;
    for (const test of module.children.allTests()) {
      const result = test.result();
      channel.send('case', { id: channel.testId(file, titles(test)), outcome: outcome(result && result.state) });
      count += 1;
    }
    const errors = typeof module.errors === 'function' ? module.errors() : [];
    if (errors.length || (!count && module.state() === 'failed') || ended === false) {
      channel.send('case', { id: channel.loadFailure(file), outcome: 'failed' });
    }
  }

  onTestRunEnd(modules, errors, reason) {
    const channel = this.started();
    if (!channel) return;
    for (const module of modules || []) this.onTestModuleEnd(module, false); // its worker died: it never ended
    channel.send('planted', { names: [], why: 'vitest has no way to add a test to a run' });
    const failed = reason !== 'passed' || (errors && errors.length > 0);
    channel.send('end', { exitstatus: failed ? 1 : 0, stopped: reason === 'interrupted' });
  }
}
