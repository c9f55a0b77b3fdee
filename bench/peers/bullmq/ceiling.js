// BullMQ's side of bench/ceiling.py: enqueue no-op jobs, or run one worker process; and
// of the enqueue round of `python -m bench` (bench/__main__.py): time addBulk.
//
//   node ceiling.js enqueue REDIS_URL QUEUE N      adds N jobs (addBulk, 1,000 a call)
//   node ceiling.js addbulk REDIS_URL QUEUE N PAYLOAD
//                                                 the same, timed: prints one JSON line
//                                                 {"jobs", "seconds", "jobs_per_s", CPU µs
//                                                 per job of this process and of Redis}
//                                                 from the first addBulk call to the last's
//                                                 return
//                                                 (connection and script loading warmed
//                                                 first, job objects built before the clock);
//                                                 PAYLOAD "noop" (data {}, forq's no-op jobs
//                                                 carry no arguments) or "mail" (the payload
//                                                 below)
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

// addBulk timed as forq's enqueue_many is: the whole list handed over, 1,000 jobs a
// call (BullMQ's addBulk is one MULTI of one script call per job; bigger calls only
// hold Redis longer), the clock from the first call to the last's return.
async function addbulk(url, name, n, kind) {
  const queue = new Queue(name, { connection: connection(url) });
  const data = (i) => (kind === 'mail' ? payload(i) : {});
  await queue.addBulk([{ name: 'noop', data: data(0) }]); // warm: connected, scripts loaded
  const chunks = [];
  for (let start = 0; start < n; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + 1000); i++) jobs.push({ name: 'noop', data: data(i) });
    chunks.push(jobs);
  }
  const client = await queue.client;
  const redisCpu = async () => { // Redis's CPU seconds so far (INFO cpu, user + sys)
    const info = await client.info('cpu');
    const field = (name) => Number((info.match(new RegExp(`${name}:([0-9.]+)`)) || [0, 0])[1]);
    return field('used_cpu_user') + field('used_cpu_sys');
  };
  const r0 = await redisCpu();
  const c0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  for (const jobs of chunks) await queue.addBulk(jobs);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const c1 = process.cpuUsage(c0);
  const r1 = await redisCpu();
  await queue.close();
  process.stdout.write(`${JSON.stringify({
    jobs: n, seconds, jobs_per_s: n / seconds,
    client_cpu_us_per_job: (c1.user + c1.system) / n, redis_cpu_us_per_job: ((r1 - r0) * 1e6) / n,
  })}\n`);
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

const [mode, url, name, n, kind] = process.argv.slice(2);
const run = mode === 'enqueue' ? enqueue(url, name, Number(n))
  : mode === 'addbulk' ? addbulk(url, name, Number(n), kind || 'noop')
  : mode === 'work' ? work(url, name, Number(n))
    : Promise.reject(new Error(`unknown mode ${mode}`));
run.catch((err) => { console.error(err); process.exit(1); });
