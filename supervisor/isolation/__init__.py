"""What keeps a job inside its limits, and says which protections are on.

| module | what it is |
| --- | --- |
| `limits` | `LimitPolice`: each child's time and memory limit, checked on one tick |
| `memory` | resident memory of a child's whole process tree, sampled cheaply |
| `shared_memory` | the memory-backed files (memfd, /dev/shm) a job's processes hold open |
| `cgroups` | per-job cgroups (v2): the kernel's memory limit and OOM verdict |
| `trail` | `MemoryTrail`: a child's memory in its last seconds, for the death report |
| `protections` | which protections are on or off and why (the start-up line, `require`) |

Three mechanisms bound a job's memory, from the strongest: a per-job cgroup's
`memory.max` (the kernel kills, and `memory.events` says so), the sampler's RSS sum of
the job's process tree (`LimitPolice` kills past the limit), and an address-space
rlimit set in the child as a backstop. `children.outcomes` reconciles them into one
reason: the cgroup's OOM verdict first, then the police's kill reason, then the exit
status.
"""
