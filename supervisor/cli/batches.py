"""forq batch: a batch's state, callbacks, and each member's state and result."""

from __future__ import annotations

import argparse
from typing import Any

from forq import JobNotFound, known_queues
from forq.batches import read_batch
from forq.store.keys import QueueKeys
from forq.store.pipelines import run_plan
from forq.supervisor.cli import render
from forq.supervisor.cli.base import Parents, emit, queue_named, redis_for


def cmd_batch(args: argparse.Namespace) -> int:
    client = redis_for(args)
    if args.queue:
        names = [queue_named(args.queue, client).name]
    else:  # a batch lives on the queue it was opened on: look in every known queue
        names = known_queues(client)
        pipe = client.pipeline(transaction=False)
        for name in names:
            pipe.exists(QueueKeys(name).batch(args.id))
        names = [name for name, found in zip(names, pipe.execute(), strict=True) if found]
        if not names:
            raise JobNotFound(f"no batch {args.id} in any queue (never opened, or its "
                              "record expired)")
    queue = queue_named(names[0], client)
    status = run_plan(client, queue.scripts, read_batch(queue.keys, args.id))
    if args.json:
        emit(status.to_dict())
    else:
        print(render.batch(status))
    return 0


def register(sub: Any, parents: Parents) -> None:
    p = sub.add_parser("batch", help="show a batch: its state, callbacks and every member",
                       parents=[parents.inspect, parents.with_config])
    p.add_argument("id")
    p.add_argument("-q", "--queue", help="the queue it was opened on (default: search)")
    p.set_defaults(func=cmd_batch)
