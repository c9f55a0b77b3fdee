"""Forking job children: the fork server (a separate, lean process that imports the
handler modules and never redis) and what each job's child does before its handler.

The supervisor talks to it through `client`; `server` runs as
``python -m forq.supervisor.fork.server``, started with a scrubbed environment
(`environment`) and dropped to the sandbox user. Nothing here imports the rest of the
supervisor: the fork server must stay small, and a child must not carry the parent.

| module | what it is |
| --- | --- |
| `client` | `ForkServer`: the supervisor's end of the fork server |
| `alone` | `spawn`: a job's child exec'd by the supervisor when there is no fork server |
| `server` | the fork server's loop: requests in, children out, their ends reported |
| `spares` | idle children forked in advance, for a job's start on an idle machine |
| `protocol` | the wire protocol both ends share (datagrams, fds, memfd for large specs), and the task table of its first message |
| `child` | what runs in a job's child: isolate, limit, run one handler, report, `_exit` |
| `messages` | what a child may say on its channel, and how the parent checks it |
| `fingerprint` | the handler code it imported, as a fingerprint of the application's files |
| `sandbox` | privileges and namespaces of the fork server and of each child |
| `orphans` | what a job leaves behind ends with it: subreapers, strays, the death signal |
| `namespaces` | a job in namespaces of its own (`[sandbox].namespaces = true`) |
| `leanfork` | a fork without Python's after-fork work, where it has nothing to do |
| `oneshot` | one job's child exec'd alone, without a fork server |
| `environment` | how the fork server is started (`Launch`): its settings and environment block |
| `hugepages` | the fork server's memory on transparent huge pages: cheap to fork when big |
"""
