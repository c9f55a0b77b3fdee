"""forq.store: how forq keeps jobs in Redis. Producers and the supervisor both use it;
a user of forq needs none of it (`forq.Queue` is the API).

| module | what it is |
| --- | --- |
| `keys` | the key schema: every key of a queue shares the hash tag `{queue}` |
| `scripts` | the Lua scripts (lua/), expanded, registered, sent by EVALSHA |
| `transitions` | each script's call built (KEYS, ARGV) and its reply parsed |
| `plans` | several calls that make one operation (enqueue, get, stats, …) |
| `pipelines` | how plans run: one pipeline, or one per shard |
| `topology` | plain Redis, Sentinel or Cluster; durability (WAIT) |
| `connection` | a client from a URL, and the password from env or file |
| `dataformat` | the data-format version held in Redis (`forq:format`) |
| `policy` | a job's limits from [defaults]/[[queue]]/[tasks], stored once by content |
| `batchspec` | a batch's members and callbacks, checked before they are sent |
"""
