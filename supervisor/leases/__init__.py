"""The leases this supervisor holds: kept alive, proven, or given up.

To change how a lease is extended, read this folder and `lua/extend.lua`.

| module | what it is |
| --- | --- |
| `keeper` | `LeaseKeeper`: every lease held (job, token, queue, last proof) |
| `renewal` | `LeaseRenewal`: the timer that extends every lease in one batched call |
| `fencing` | `Fencer`: stop every child whose lease can no longer be proven held |
| `held` | `HeldLeases`: jobs leased ahead of a free slot (a queue's `prefetch`) |
| `calls` | `LeaseCalls`: the lease transitions of one queue (claim, extend, ack, …) |
"""
