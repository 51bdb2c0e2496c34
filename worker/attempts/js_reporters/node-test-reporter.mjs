/*
 * FrogFix's reporter for node's own test runner (`node --test`, started again by hook.cjs with this
 * reporter beside spec): each test's result goes out on the results channel as node reports it, and
 * the run's own verdict at the end (node exits 1 when any test failed). Node reports a test's start
 * before its result, so the describe blocks around it are the starts still open at its depth.
 */
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);

export default async function* frogfixReporter(source) {
  const channel = require('./hook.cjs').takeSender();
  if (channel) channel.start('node-test', process.version);
  const open = new Map(); // file -> names of the tests started, by depth
  let failed = false;
  for await (const event of source) {
    if (!channel || (event.type !== 'test:start' && event.type !== 'test:pass' && event.type !== 'test:fail')) continue;
    const data = event.data || {};
    const file = data.file || '';
    const depth = Number(data.nesting) || 0;
    const names = open.get(file) || [];
    if (event.type === 'test:start') {
      names.length = depth;
      names.push(data.name);
      open.set(file, names);
      continue;
    }
    const failing = event.type === 'test:fail' && !data.todo;
    failed = failed || failing;
    if (depth === 0 && data.name === file) {
      if (failing) channel.send('case', { id: channel.loadFailure(file), outcome: 'failed' });
      continue;
    }
    if (data.details && data.details.type === 'suite') continue;
    const outcome = data.skip || data.todo ? 'skipped' : failing ? 'failed' : 'passed';
    channel.send('case', { id: channel.testId(file, [...names.slice(0, depth), data.name]), outcome: outcome });
  }
  if (channel) {
    channel.send('planted', { names: [], why: "node's test runner has no way to add a test to a run" });
    channel.send('end', { exitstatus: failed ? 1 : 0, stopped: false });
  }
}
