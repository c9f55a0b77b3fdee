"""The supervisor's children, from the decision to fork to the meaning of their end.

| module | what it is |
| --- | --- |
| `table` | `Children`: the running children and the slots per queue |
| `running` | `Running`: the parent's view of one child (lease, limits, pipe, group) |
| `budget` | `MemoryBudget`: admission by memory, `[supervisor] memory_budget` |
| `launch` | `Launcher`: what a leased job's child needs, decided before the fork |
| `spawner` | `Spawner`: fork each child (through the fork server), report each end; a new fork server on reload |
| `strays` | `Strays`: the supervisor as the last subreaper: what jobs left behind ends |
| `outcomes` | what an end means: ack, fail, expire, release or drop |
| `reader` | `MessageReader`: a child's messages read as they arrive, capped, checked against `fork.messages` |
| `chunks` | a chunked task's jobs in one child (`task(chunk=N)`): grouping, each job's end |
| `chunk_reader` | `ChunkReader`: a chunk's results, one per job, checked against its jobs |
| `cost` | what a finished run cost (CPU, peak memory, wall time, start latency), as reported |
| `output` | a job's stdout and stderr: captured, capped, attributed |
| `answers` | `Answers`: what the supervisor writes back to a child, without blocking |
"""
