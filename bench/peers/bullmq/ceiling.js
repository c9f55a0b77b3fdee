// BullMQ's side of bench/ceiling.py: enqueue no-op jobs, or run one worker process.
//
//   node ceiling.js enqueue REDIS_URL QUEUE N      adds N jobs (addBulk, 1,000 a call)
//   node ceiling.js work REDIS_URL QUEUE CONCURRENCY
//                                                 a Worker with that concurrency and a
//                                                 no-op processor; prints "ready" once
//                                                 connected, runs until SIGTERM
// Job data is the same realistic payload forq's simulated supervisors carry, so both
// move the same bytes. BullMQ's defaults otherwise (completed jobs kept, events stream).
'use strict';
const { Queue, Worker } = require('bullmq');

function connection(url) {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port || 6379), db: Number(u.pathname.slice(1) || 0),
           maxRetriesPerRequest: null };
}

function payload(i) {
  return { args: [`user-${i}@example.com`, { template: 'welcome-v3', locale: 'en-GB',
    vars: { name: 'Ada Lovelace', plan: 'pro', trial_days: 14 } }],
    kwargs: { campaign: 'autumn-2026', dry_run: false } };
}

async function enqueue(url, name, n) {
  const queue = new Queue(name, { connection: connection(url) });
  for (let start = 0; start < n; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + 1000); i++) {
      jobs.push({ name: 'noop', data: payload(i) });
    }
    await queue.addBulk(jobs);
  }
  await queue.close();
}

async function work(url, name, concurrency) {
  const worker = new Worker(name, async () => null,
    { connection: connection(url), concurrency });
  await worker.waitUntilReady();
  process.stdout.write('ready\n');
  const stop = async () => { await worker.close(true); process.exit(0); };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
}

const [mode, url, name, n] = process.argv.slice(2);
const run = mode === 'enqueue' ? enqueue(url, name, Number(n))
  : mode === 'work' ? work(url, name, Number(n))
    : Promise.reject(new Error(`unknown mode ${mode}`));
run.catch((err) => { console.error(err); process.exit(1); });
