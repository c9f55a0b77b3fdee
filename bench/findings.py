"""What profiling found where a target is missed: causes and proposed fixes.

Written by hand on 2026-11-29 from profiles of the supervisor (py-spy, cProfile, /proc
counters, and A/B runs of `forq run` with experimental monkeypatches from
bench/experiments/) on this 2-core machine. The tables above are regenerated on every
run; this section is not. bench/report.py appends it to RESULTS.md.
"""

FINDINGS = """
## Findings: where the time went, what was fixed, what is left

Profiled with py-spy (the tables above), cProfile inside the supervisor, `/proc/PID/stat`
counters (CPU, minor faults) and A/B drains of `forq run` with proposed fixes applied as
monkeypatches (`bench/experiments/`, removed once their fixes landed; `git show 8b1b213:bench/experiments/ab.py`). The figures
in this section come from those profiling runs (2026-11-29, load 1–3 unless said), not from
the tables above.

### Already fixed during this work (the tables above include these fixes)

1. **Finished children kept for 5 minutes.** A per-child time-limit timer, never cancelled,
   kept each `RunningChild` alive until the job's time limit (default 5 min): RSS grew
   ≈ 5.2 KB per job (36.7 → 69.7 MiB after 6,477 jobs), and fork cost grows with RSS.
   Now `Supervisor._police_children` checks deadlines on the sampling tick: RSS after a
   3,000-job drain went from 52.7 MiB to 37.7 MiB.
2. **A `SCRIPT EXISTS` round trip before every pipeline** (redis-py's
   `Pipeline.load_scripts`, ≈ 30% of the supervisor's wall time in py-spy, 1.3–1.5 per
   job). Now `jobs/store/scripts.py: ScriptPipeline` loads each script once per pool and reloads
   on NOSCRIPT: 43.7 → 41.3 Redis commands per job.
3. **Child set-up:** `ctypes.CDLL(None).prctl` is resolved once (`_PRCTL`), and `_sandbox`
   no longer clears and refills `os.environ`: `_die_with_parent` 0.56 → 0.23 ms and title +
   `_sandbox` 0.68 → 0.19 ms at p50 in the latency split (finding 5).

With them, end to end went from 221–251 jobs/s (35–49% of each run's fork limit) to ≈ 313
(45%), and from 2.0–2.2× RQ's forking worker to 2.8×.

### 4. Still open, the largest: copy-on-write faults — fork from a lean fork server

Targets: ≥ 50% of the fork limit, ≥ 3× RQ's forking worker.

The supervisor spends ≈ 2.65 ms CPU per job, 1.8 ms of it *system* time, and takes ≈ 580
minor page faults per job; a bare fork cycle of the same size costs its parent 0.34 ms and
34 faults. With two children alive nearly all the time, every page of the supervisor's heap
is shared copy-on-write with a child, so each page its Python code writes between forks
(reference counts, claim parsing, `Job` objects, log records, metric labels, selector
registrations) is copied — ≈ 580 × 4 KiB per job. The child pays the same way: ≈ 2.1 ms CPU
against 1.07 ms for a bare fork+_exit.

The supervisor is big because `import redis` (8.x) alone takes a Python process from 10.6 to
29.7 MiB (it imports asyncio and `redis.asyncio`); it idles at ≈ 37 MiB, where a bare fork
cycle runs ≈ 700/s, against ≈ 1,700–2,500/s at 14 MiB. Handler modules pull redis in too:
`from forq import task` runs `jobs/__init__.py`, which imports `forq.queue` and so redis
(31 MiB for `import forq.registry`).

**Fix:** fork job children from a *fork server*: a helper started at start-up, exec'd fresh
(`python -m forq.supervisor.forkserver`), importing only `forq.registry`, `forq.supervisor.child`
and the configured handler modules — which needs `jobs/__init__.py` to import `Queue` & co.
lazily (PEP 562 module `__getattr__`) so that handler modules do not drag in redis. The
supervisor sends it each `ChildSpec` plus the result pipe's write end (SCM_RIGHTS over a
unix SOCK_SEQPACKET socketpair); the fork server forks, opens the child's pidfd *before* it
can reap it and sends it back with the pid, and reports `(pid, status, ru_maxrss)` when it
reaps the child (the supervisor's `os.wait4` in `_on_child_exit` becomes a read of that
report). PDEATHSIG chains child → fork server → supervisor; `killpg`, psutil sampling and
pidfd polling all work on a grandchild. The fork server must import and initialise all a
child uses before forking — notably call `setproctitle` once: a child that must import and
initialise setproctitle itself costs 6.2 ms CPU instead of 2.1 ms. The supervisor then never
forks after start-up, so it takes no copy-on-write faults and its RSS no longer sets the
fork cost. A SIGHUP that changes `imports` restarts the fork server.

Prototype (`bench/experiments/forkserver.py`, 20 MiB, no redis; `patched_run.py`'s
`forkserver` patch), A/B drains of 3,000 no-op jobs, interleaved, with the fixes above
already in; fork limit of the supervisor's size measured in the same session: 735/s.

| supervisor | jobs/s (3 runs) | of the fork limit | supervisor CPU/job | its faults/job | fork server + children CPU/job |
| --- | --- | --- | --- | --- | --- |
| as is | 336, 327, 325 | 44–46% | 2.5–2.7 ms | ≈ 585 | 2.0–2.1 ms |
| per-job INFO lines off (finding 6) | 348, 323, 336 | 44–47% | 2.3–2.5 ms | ≈ 565 | 2.0–2.1 ms |
| that + lean fork server | 426, 413, 434 | 56–59% | 0.7 ms | 0 | 2.6 ms |

≈ +28% throughput, and ≈ 3.3 ms of supervisor + child CPU per job instead of ≈ 4.7 ms; against RQ's
forking worker (≈ 110–115 jobs/s in the full runs) that is ≈ 3.7×. Both targets met.

**Implemented** (`supervisor/forkserver.py`, `[supervisor].fork_server = true` by default;
`false`, or a fork server that cannot start, forks from the supervisor as before). Quick
runs (`bench/supervisor.py --quick`, 2026-11-29, load ≈ 1, interleaved with the code
before it): 335, 330 → 466, 438 jobs/s; 45% → 62–63% of the fork limit (709–742/s);
supervisor CPU 2.7 → 0.7–0.8 ms per job and 715 → 0 page faults; fork server + child
2.6–2.7 ms. `python -m bench --quick --only limits,e2e`: 406 jobs/s, 59% of the fork
limit, 3.5× RQ's forking worker (116 jobs/s). The tables above predate it.

### 5. Pick-up latency: fork and the child's set-up, not Redis

Target: p50 ≤ 5 ms (≈ 6.1–8.3 ms in the full runs; 5.1 ms in one quick run on an idle
machine).

Split of one job's pick-up with the fixes above (`python -m bench.experiments.ab --split ""`:
time marks put in the child's environment by a patched supervisor; 80 samples, load ≈ 2,
p50): enqueue call 0.82 ms → claim reply parsed 0.80 ms → fork called 0.11 ms → `run_child`
starts 2.56 ms → `_die_with_parent` 0.23 ms → `_isolate` 1.03 ms → title + `_sandbox`
0.19 ms → `_limit` 0.30 ms → handler 0.11 ms; 6.55 ms in all. Redis is ≈ 1.6 ms of it;
fork and the child's first touches of the parent's memory (copy-on-write) are the rest. A
bare fork to the child's first line in a same-size process takes ≈ 1.1 ms on an idle
machine. The child's `nice` made no difference at p50. With the fork-server prototype
(measured before fixes 1–3) the total was 5.4 ms against 6.3 ms without it.

**Fix:** *pre-fork one child per free slot*: fork and isolate it (setsid, fds, PDEATHSIG,
nice, title) while the slot is idle, and let it block on a pipe for its `ChildSpec`; on
claim the parent (or the fork server) writes the spec, and the child applies the job's
rlimits and runs the handler. Each child still runs exactly one job and exits — the
isolation is unchanged — but fork and set-up leave the pick-up path: ≈ enqueue + one claim
round trip + a pipe write, ≈ 2 ms (estimated, not prototyped). Pre-forked children are
discarded on SIGHUP and on drain.

### 6. Per-job work in the supervisor's loop

py-spy (the table above): logging ≈ 14% of the supervisor's wall time (two INFO lines per
job, "started" and "succeeded"), `labels()` of the prometheus metrics ≈ 7 calls per job
(3% self time), `setproctitle` twice per job. Each also writes pages that are then copied
(finding 4). **Fix:** log "started" at DEBUG ("succeeded" already carries the id, task and
duration); cache the labelled metric children per (queue, task) in `supervisor/observe/metrics.py`;
set the title at most every 100 ms (a timer), not on every start and exit. Worth ≈ 0–4% on
its own in the A/B above; more once the fork server has removed the larger costs.

### 7. enqueue_many: Redis-bound at ≈ 28 µs per job

Target ≥ 40,000 jobs/s: 43,000–47,000/s on a quiet machine, 22,000–37,000/s while other
work loaded it. For 20,000 jobs: ≈ 570 ms in `lua/enqueue.lua` on the Redis side (9 Redis
commands per job) and ≈ 240 ms of client CPU, one after the other. **Fix (lua/enqueue.lua,
lua/_lib.lua):** per call rather than per job — one `INCRBY seq N` instead of an `INCR`
per job; one `HINCRBY stats enqueued N`, one `HINCRBY` of the minute and one `PEXPIRE`
instead of three per job; no `LTRIM` on a new job's history: 9 → ≈ 4 commands per job.
Client side: reply only for jobs that were not plainly `pending` (60,000 reply items are
parsed per 20,000 jobs now), and send each 500-job chunk as it is built so that Redis and
the client overlap.

### 8. Smaller: the claim script's 11 `HSETNX` per job

`lua/claim.lua` applies the queue policy with one `HSETNX` per field: 11 of the 41 Redis
commands per job. Redis CPU is ≈ 0.25 ms per job in all, so not a bottleneck today; one
`HMGET` of the policy's fields and one `HSET` of the missing ones would do. (Fixed in
issue 18 another way: the policy is stored once per queue; see Findings II.)

### What the peers' figures mean

RQ's forking worker runs ≈ 59 Redis commands per job (DESIGN.md's "about 58") and forks a
≈ 37 MiB process per job too. After a SIGKILL of the whole worker, none of RQ, Celery
(acks_late + reject_on_worker_lost) or Dramatiq runs the job again within a minute: RQ
leaves it `started` until its registry cleanup (every 10 minutes, once the job's heartbeat
TTL has passed); Celery leaves the message unacked until `visibility_timeout` (1 hour by
default); Dramatiq's Redis broker re-queues a dead worker's messages only after
`heartbeat_timeout` (60 s), at a randomly chosen maintenance pass (1 in 1,000 broker
commands, so minutes on an idle queue). Dramatiq's main process also stops every worker
when one worker process dies, so killing the process running a job acts like killing the
whole worker. Celery's prefork pool (no fork per job) is the fastest at draining no-ops.
"""

# Issue 18 (Performance II), written by hand on 2026-12-01 while other work loaded the
# machine (load average 8–16 on 2 cores): the Redis-side figures are per job and were
# compared within one run; absolute times are inflated by the load.
FINDINGS_18 = """
## Findings II (issue 18): the Redis cost per job, and a supervisor holding 1,000 leases

### The profile

`python -m bench.ceiling` before the fixes (8 simulated supervisors × 50 slots, 10,000
jobs, load ≈ 3): forq **36.3 commands and 76 µs of Redis CPU per job** — HSETNX 10.6
(the claim wrote the policy into every job, one field at a time), PEXPIRE 3, HINCRBY 3,
HGET 3, LTRIM 2, RPUSH 2, HSET 2, and one EVALSHA + TIME + HMGET + HEXISTS + ZREM per ack.
BullMQ 5.81 in the same session: 23.6 commands, 49.5 µs; Dramatiq 11.7 and 68 µs; RQ
SimpleWorker 57 and 462 µs.

`perf record` of redis-server during a claim-only and an ack-only phase (20,000 jobs,
batches of 50) gave a flat profile: hash lookups (`dictFind`, `dictSdsKeyCompare`: keys
and the command table), number-to-string formatting (`__printf_fp`, `hack_digit`,
`__mpn_divrem`: Lua's `tostring`, cjson, numbers passed to `HSET`), the Lua VM, reply
building. So the scripts were measured by variants instead (Redis CPU per job, claim only,
batches of 50): 38.8 µs as they were; 23.8 µs without the policy (11 fields written and
returned per job, each number formatted); 29.4 µs without the history entry (a table
built and `cjson.encode`d per job); 29.8 µs without returning the records. For ack (one
call per job): 26–34 µs, of which **10–14 µs remain when the script returns right after
its token check** — the call itself (EVALSHA, KEYS/ARGV conversion, the `_lib` functions
defined anew on every call) is a third to a half of an ack.

### The fixes, in order (each measured by `python -m bench.ceiling`)

1. **claim: one HGETALL and one HSET per job**, the rest per call: `EXISTS` replaced by the
   HGETALL the reply needs; the done markers of the batch in one `MGET`, its tokens in one
   `INCRBY`, its leases in one `ZADD`; the scheduled set looked at once (`ZRANGE 0 0`) and
   searched only when something is due; `ZCARD pending` only when the pop was not short;
   history trimmed only when over its cap (`RPUSH` answers the length); the minute
   window's expiry set by its first count. ack reads what `succeed` needs in its token
   check's `HMGET`, and writes `attempts` in its `HSET`. 36.3 → 15.1 commands per job.
2. **The policy stored once per distinct policy** (`forq:{q}:policy:<sha1 of its JSON>`, a
   hash; `forq/policy.py`), named by the job's first claim (its `policy` field; a
   producer's own limits stay in the job and win). The job carries only `result_ttl_ms`,
   which every ack needs; fail and reclaim read the rest through `job_limits`, the claim
   reply and `Queue.get` show every limit as before. Claim's history entry is built as a
   string. Claim: 38.8 → 19–24 µs per job.
3. **One ack call per queue per loop turn** (`Queue.ack_many`; the Reporter's
   `send_batch` puts a turn's acks after its other commands, so a completion record or a
   follow-up to another queue still lands before its ack): the call's fixed cost, `TIME`,
   the counters, `slot_freed` and the `ZREM` from `active` are paid once per batch.
   15.1 → 9.3 commands per job; 57 → 31–37 µs of Redis CPU per job, while BullMQ took
   61–63 µs in the same runs (load 12–14): forq's ceiling ≈ 1.8–2.0× BullMQ's.

What is left per job at 8 × 50: HGETALL, HSET, RPUSH (claim); HMGET, HSET, HDEL, RPUSH,
PEXPIRE of the record and of its history (ack). Keeping the history in the job's hash
would save three more, but `forq job`, the chaos checker and tests read the history list.

**A supervisor with few slots** (concurrency 2, the end-to-end table) claims and acks one
job per call, so the per-call commands count in full: 44 → 24 commands per job (claim
≈ 13, ack ≈ 12). The ≤ 15 target holds where Redis is the limit — many supervisors with
many slots — not for a lone supervisor with two.

### A supervisor holding 1,000 leases (`python -m bench.leases`)

1,000 sleeping jobs, concurrency 1,000, lease ttl 6 s, fork server on, RSS sampling:
before, **all 1,000 leases ran out while their children were being started**: one claim
leased all 1,000 at once, starting them took 19 s on the loaded machine, and the loop
could not extend anything meanwhile; the supervisor's own reaper reclaimed them and
fenced the children. Now a claim leases at most 32 (`CLAIM_BATCH`) and a full batch
claims again without waiting: none ran out, the earliest lease kept ≥ 63% of its ttl.
Once running, the supervisor used **30% of a core, 77% of it RSS sampling** (py-spy:
`tree_rss`, 1,000 process trees every 50 ms); lease extension was 0.6%. Now at most 64
children are sampled per tick, in turn (each every 0.8 s at 1,000 children; time limits
are still checked for all on every tick, and the address-space rlimit stays the backstop
between samples): **4.1% of a core, supervisor RSS 42 MiB** (fork server 20 MiB).

### The child's steps between fork and the handler (measured, not trimmed)

200 forks of a process the fork server's size, each step timed in the child (p50, load
≈ 12): fork to the child's first line 1.38 ms; PDEATHSIG 0.08; `_isolate` (setsid,
signals, close_range, stdin) 1.00; title 0.015; `_sandbox` 0.14; `_limit` (rlimits,
oom_score_adj, nice) 0.29; the handler and its report 0.19 ms. The same calls in a
process that did not just fork take microseconds (close_range 2 µs, the signal resets 7
µs, stdin 4 µs, oom_score_adj 12 µs): the child pays copy-on-write faults on its first
touches of the fork server's memory, not the steps themselves. Pre-forking one child per
idle slot (finding 5 below) takes fork and set-up out of the pick-up path; it is not done.
(Done since: the spares of Findings III.)

## Findings III (issue 18, 2026-12-02): the idle pick-up, hop by hop, and 1,000 children sampled

### Where an idle pick-up's time goes

Time marks written by each process on the path (a temporary patch, not kept), 100 jobs
one at a time on an idle supervisor with spares, p50 from the start of the enqueue call
(2026-12-02, load ≈ 1): the enqueue call returns at +1.09 ms, and the supervisor is
woken by its publish at +1.16; it has read the message at +1.39, built the claim at
+1.59 and sent it at +1.62; the claim's reply is read at +2.05; the request to the fork
server goes at +2.35 and is read there at +2.63; the spare has it at +3.08, has decoded
it at +3.24, and is in the handler's module at +3.59: **2.5 ms from the enqueue's
return** (1.6 ms in the full run above, taken in a quieter hour of the same machine,
when forks also ran three times as fast). Each hop is a process woken from idle (the supervisor, the fork server, the
spare) and a few hundred µs of Python in it; the claim round trip is 0.45 ms.

What was taken out of that path, each measured by 3 × 100 samples interleaved with the
code before it (claim → handler, p50):

1. The spare **detaches while it waits** (its session, default signals, stdin, systemd
   variables): 3.6–3.7 → 3.3–3.5 ms.
2. It **presets its priority** (nice, oom_score_adj, no core dumps) to those of the fork
   server's last request; a job of another priority is forked for it and the spares are
   replaced: a niced process cannot be un-niced without privileges. `_limit` was
   0.54 ms of the child's set-up (the first write to oom_score_adj, and copy-on-write
   faults): 3.4–3.6 → 2.7–2.9 ms.
3. The fork server and the new spare **rehearse** the last request's decoding right
   after the spare's fork: a spare shares every page with its fork server, and the first
   write to one on either side copies it. The fork server's hand-off went 0.54 →
   0.34 ms, the spare's decoding 0.29 → 0.22 ms.
4. The request is JSON-encoded once (it was twice), and a spare does not check its
   parent again.

Left: the three wake-ups are the floor of this design. A spare that the supervisor
writes to directly (the fork server told after) would save a hop, about 0.5 ms, at the
price of moving the spares' bookkeeping (priority, retirement, fencing) into the
supervisor; not done.

### 1,000 children sampled (`python -m bench.leases`)

`strace -c` of the supervisor holding 1,000 sleeping jobs, 10 s: 22,144 `openat`,
22,144 `read`, 22,144 `close` and 11,138 `poll` — the memory sampler's 64 trees per
tick, each an open, read and close of `statm`, a listing of `task/`, the same of each
thread's `children`, and a pidfd poll first; 11.2–11.5% of a core in all. Now each
child's `/proc/PID/stat` and `children` are opened once, at its first sample, and read
with `pread` after (a held /proc file answers for the process it was opened on, never
for a later one given its pid: ESRCH once it is gone); `stat` gives the rss and the
thread count, so one `children` file is enough for a single-threaded process; and a
child with nothing due on a tick costs no syscall. **3.4–3.6% of a core** (target < 5%).

### Under load: copy-on-write, not the fork (still open: 61% of the fork limit, target 80%)

`perf stat -p` on the fork server during a 2,000-job drain at concurrency 2 (463 jobs/s,
2026-12-02): the fork server alone **1.0 ms of CPU and 220 page faults a job** (a bare
fork's parent: 0.32 ms, 36), its children **1.39 ms and 515 faults** (a bare fork's
child: 0.98 ms, 262), the supervisor 0.78 ms and no fault. Two children are alive nearly
all the time, so every page the fork server writes between forks (decoding and checking
a request, reaping, reporting) is copied, and so is every page a child's Python touches.
Not done, in the order they would help: fork from a zygote — a process that does nothing
but fork, in a loop that touches a few pages, while the fork server decodes, checks and
reaps elsewhere; then an asynchronous spawn, so the supervisor's loop goes on while the
fork server forks (py-spy: it waits in `ForkServer._receive` 18% of its time).

## Findings IV (issue 18, 2026-12-02, a second session): the child's first millisecond

On another host (AMD EPYC, 2 cores; a fork limit of 300–400/s, half the first one's,
and noisy: the same drain ran at 213–332 jobs/s within minutes), CPU time was the only
steady measure, so each change was measured in one process, alternating.

- **Where a child's time went.** Thread CPU time at each step of `run_child`, in a
  process set up as the fork server is: 1.1 ms from the fork to the child's first line
  of Python — a child that `_exit`s at once costs as much. That is Python's after-fork
  hooks: importing `threading` alone takes a child from 105 to 214 page faults and
  from 0.61 to 0.93 ms; `logging` (which setproctitle imports) as much again. The
  hooks rebuild threading's thread table, logging's locks and random's seed, in Python
  code whose every first write to an object copies its page.
- **Fixed: a lean fork** (`supervisor/fork/leanfork.py`): libc's `fork()` when those
  hooks have nothing to do (one thread; no hook but threading's, logging's and
  random's; the child reseeds random itself), else `os.fork()`. `python -m
  bench.childcost` (two runs): a child that exits at once 0.68–0.73× the CPU of an
  `os.fork()` child, a no-op job's 0.74–0.84× (0.55–0.88 ms less).
- **Fixed: steps that did nothing.** Removing six systemd variables the fork server
  never had (each `os.environ.pop` of an absent name raises and catches a KeyError),
  and an `os.environ.update` with nothing to update (an ABC instance check): measured
  alone in a fresh child, over a call that does nothing, 0.21 and 0.32 ms of CPU (less
  in `run_child`, where earlier steps touched some of the same pages). With the lean
  fork: a no-op job's child 2.05–2.33 ms of CPU against 2.36–3.10 ms, ≈ 400 faults
  against ≈ 490 (300 forks each, old and new code alternating).
- **End to end** (`drain_once`, old and new code alternating, same hour): at
  concurrency 2, 6 pairs of 1,000-job drains, the fork server's and its children's CPU
  fell from 5.83 to 5.25 ms a job (lower in 5 pairs of 6) but the rate did not move
  (208 and 210 jobs/s): there the drain waits on hops between processes more than on
  CPU (below). At concurrency 8, CPU-bound, 4 pairs of 1,500: 267 → 283 jobs/s (+6%,
  the new code ahead in each pair).
- **Spares wait for quiet.** The fork server forked spares whenever no job ran, which
  at concurrency 2 happens between jobs: py-spy of the fork server during a drain had
  a quarter of its samples in forking spares and a tenth in rehearsals. Now a spare is
  forked only after 5 ms without a job (the idle latency benchmark waits 20–50 ms
  between jobs).
- **Tried and dropped: a spare forked on demand** as a freed slot's claim goes out, so
  that the fork overlaps the round trip to Redis: 5 pairs of drains at concurrency 2,
  the fork server's and children's CPU 4.68 → 5.30 ms a job and 235 → 218 jobs/s. A
  spare costs more than the fork it moves (its own socketpair, a second decoding, the
  copies of what the fork server writes while it lives).
- **Measured and left alone: acking on the result.** The supervisor reports a job when
  its child has exited, not when its result arrives; the gap, measured during a drain,
  is 0.12 ms at p50 (0.66 ms at p90): the exit report and the end of the result pipe
  arrive in the same loop turn. Not worth the exit status it would give up.
- **What a slot waits for.** A no-op job's child lives 4–6 ms from the fork to the
  report of its end on this host, for 2–3 ms of its own CPU: it is niced (10) and
  shares 2 cores with the other job, the supervisor, the fork server and Redis. At
  concurrency 2 the machine is 15–25% idle, so the next lever is not CPU but
  overlap: a slot could start its next job the moment its child ends only if that job
  were already leased (a prefetch, as Dramatiq and Celery do, with its leases kept
  like a running job's).

## Findings V (issue 18, 2026-12-02, a third session): prefetch

Same kind of host as IV (AMD EPYC, 2 cores; the fork limit of the supervisor's size
248–348/s across the day, a C program's fork+exit+wait 2,376/s).

- **Built: `prefetch = N`** per `[[queue]]` (`supervisor/leases/held.py`, default 0): the
  claim asks for the free slots plus N; a job leased while its queue's slots are full
  is held, its lease in the `LeaseKeeper` (extended, fenced), and starts in the loop
  turn that sees a child of its queue end, before that child's report goes out; the
  claim that tops the prefetch up rides with the ack. A drain, a cancel and a reload
  that lowers the prefetch `release` held jobs at once (no attempt counted).
- **Measured** (`drain_once`, 2,000 no-op jobs, concurrency 2, prefetch 0 and 4
  alternating, 5 pairs in one run): 269 jobs/s median (211–328) against **299**
  (289–310); the supervisor's CPU 1.44 → 1.21 ms a job (one claim a turn for a slot
  and its prefetch), the fork server's and children's 4.00 → 3.82 ms. A run of 0, 2,
  4 and 8 (4 rounds each): 247, 255, 266, 269. The full benchmark of 13:42 (above):
  285 → **352 jobs/s, 101% of the fork limit** measured in the same run, the
  prefetched runs steadier too.
- **Where the time goes with prefetch 4** (a drain of 6,000, CPU of each process over
  8 s): the fork server 44% of a core, five sixths of it system time (the fork), the
  supervisor 35%; at 266 jobs/s the children ≈ 58%; the machine is still about a
  quarter idle, so the bound is the chain a slot waits on (the exit's report to the
  supervisor, its spawn request, the fork, the niced child), not one process.
- **Why ≥ 1.0× Dramatiq is out of reach here.** Per job forq spends ≈ 5.5 ms of CPU
  (supervisor 1.2, fork server ≈ 1.6, child ≈ 2.2, Redis 0.5), so two cores cap it near
  360/s even with no wait at all; Dramatiq's two processes ran 516/s. The child's 2.2 ms
  is mostly the kernel's (page faults, the exit of a 21 MiB copy): a bare fork+_exit of
  a process the fork server's size costs 1.2–1.6 ms on this host, against 0.4 ms for a
  C program's.
- **Tried and dropped: transparent huge pages** for the fork server's heap (`madvise`
  `MADV_HUGEPAGE` + `MADV_COLLAPSE` of its anonymous regions, so that a fork copies a
  page-table entry per 2 MiB): only 2 MiB of its 11 MiB of anonymous memory lie in
  2 MiB-aligned runs (Python's arenas are 1 MiB mappings), and fork+exit rates moved
  within the noise (619–851/s before, 786–850/s after).
- **Not done: an asynchronous spawn.** py-spy has the supervisor in
  `ForkServer._receive` (waiting for the fork's pid) 20% of its samples and in
  `send_encoded` 15%; with the pid answered later, the ack and the claim could go out
  while the fork server forks. Every part of the supervisor that signals, samples or
  fences a child needs its pid, so a child without one yet is a larger change.
"""
