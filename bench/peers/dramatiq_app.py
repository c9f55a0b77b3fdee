"""The Dramatiq app: Redis broker, results in Redis (so completions can be counted and
the stamp read back). Dramatiq acks a message after its actor ran: at-least-once by
default. URLs come from the environment; with BENCH_APP set (bench/apps), each worker
process loads that application at start, as it would import a real app's modules."""

from __future__ import annotations

import os

import dramatiq
import peer_tasks
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

broker = RedisBroker(url=os.environ.get("BENCH_DRAMATIQ_BROKER", "redis://127.0.0.1:6379/4"))
backend = RedisBackend(url=os.environ.get("BENCH_DRAMATIQ_RESULTS", "redis://127.0.0.1:6379/5"))
broker.add_middleware(Results(backend=backend))
dramatiq.set_broker(broker)

if os.environ.get("BENCH_APP"):  # set for the workers only (driver.py's Peer.env)
    from bench.apps import load_from_env

    load_from_env()


@dramatiq.actor(actor_name="bench.noop", queue_name="bench", store_results=True)
def noop(*args, **kwargs):
    return peer_tasks.noop(*args, **kwargs)


@dramatiq.actor(actor_name="bench.stamp", queue_name="bench", store_results=True)
def stamp():
    return peer_tasks.stamp()


@dramatiq.actor(actor_name="bench.marked_sleep", queue_name="bench", store_results=True,
                time_limit=120_000)
def marked_sleep(path, seconds=20.0):
    return peer_tasks.marked_sleep(path, seconds)
