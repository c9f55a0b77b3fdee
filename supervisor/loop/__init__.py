"""The supervisor's heartbeat of time: one event loop, and what it does on its own.

| module | what it is |
| --- | --- |
| `eventloop` | `EventLoop`: one selector, one timer heap, signals as events |
| `timers` | the heap of one-shot and repeating timers the loop runs |
| `wakeups` | `Wakeups`: when to claim, without busy polling (pub/sub, timers, a poll) |
| `drain` | `Drain`: what SIGTERM and SIGINT mean (stop claiming, wait, release) |
| `reload` | `Reload`: what SIGHUP means (the config re-read, the handler code re-imported) |
| `sdnotify` | the systemd notify protocol (READY, STATUS, WATCHDOG, STOPPING) |
| `heartbeat` | `Heartbeat`: the status line, the process title, the roster record |
| `status` | the words of the status line and title, and the queue depths for metrics |
| `logs` | logging set-up: one line per job transition, text or JSON |
"""
