'use strict';
/*
 * FrogFix's jest reporter (added by hook.cjs to the configuration jest read, beside the project's own):
 * each test file's results go out on the results channel as the file ends. hook.cjs sends the run's
 * end status once runCLI returns. The channel comes from hook.cjs, once.
 */
const hook = require('./hook.cjs');

class FrogFixJestReporter {
  constructor() {
    this.channel = hook.takeSender();
    if (this.channel) this.channel.start('jest', hook.jestVersion());
  }

  onTestFileResult(test, result) {
    const channel = this.channel;
    if (!channel) return;
    const file = (test && test.path) || (result && result.testFilePath);
    const cases = (result && result.testResults) || [];
    for (const one of cases) {
      const status = one.status;
      const outcome = status === 'passed' ? 'passed' : status === 'failed' ? 'failed' : 'skipped';
      channel.send('case', { id: channel.testId(file, [...(one.ancestorTitles || []), one.title]), outcome: outcome });
    }
    if (result && result.testExecError) channel.send('case', { id: channel.loadFailure(file), outcome: 'failed' });
  }

  getLastError() {
    return undefined;
  }
}

module.exports = FrogFixJestReporter;
