"""arq's enqueue, timed in the peers' venv (bench/.venv-peers) for bench/asyncio_enqueue.py.

    python bench/peers/arq_enqueue.py REDIS_PORT JOBS CONCURRENCY

Prints one JSON line: {"jobs": n, "seconds": s, "commands": redis commands per job,
"cpu": this process's CPU seconds (user + system) spent enqueueing}.
arq has no batch enqueue: each job is `ArqRedis.enqueue_job` (a WATCH/MULTI/EXEC
transaction), `CONCURRENCY` of them in flight at once on one pool.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time


async def main(port: int, jobs: int, concurrency: int) -> dict[str, float]:
    from arq import create_pool
    from arq.connections import RedisSettings

    pool = await create_pool(RedisSettings(host="127.0.0.1", port=port, database=2),
                             default_queue_name="arqbench")
    before = (await pool.info("stats"))["total_commands_processed"]
    share = [jobs // concurrency + (1 if i < jobs % concurrency else 0)
             for i in range(concurrency)]

    async def producer(n: int) -> None:
        for _ in range(n):
            await pool.enqueue_job("noop", 1)

    usage = resource.getrusage(resource.RUSAGE_SELF)
    start, cpu = time.perf_counter(), usage.ru_utime + usage.ru_stime
    await asyncio.gather(*(producer(n) for n in share))
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu
    after = (await pool.info("stats"))["total_commands_processed"]
    await pool.flushdb()
    await pool.aclose()
    return {"jobs": jobs, "seconds": seconds, "commands": (after - before - 1) / jobs,
            "cpu": cpu}


if __name__ == "__main__":
    port, jobs, concurrency = (int(a) for a in sys.argv[1:4])
    print(json.dumps(asyncio.run(main(port, jobs, concurrency))))
