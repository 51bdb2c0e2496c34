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

export default class FrogFixReporter {
  constructor() {
    this.channel = require('./hook.cjs').takeSender();
    this.seen = new Set();
  }

  onInit(vitest) {
    this.version = vitest && vitest.version;
  }

  started() {
    /* The session starts with the first result: a vitest without these hooks (before 3) claims nothing. */
    if (this.channel) this.channel.start('vitest', this.version);
    return this.channel;
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
