"""Private multi-process Redis topologies for tests and benchmarks.

* `LocalCluster`: N ``redis-server --cluster-enabled yes`` on free ports (data port and
  cluster-bus port both chosen free), each in its own temporary directory, joined with
  ``redis-cli --cluster create ... --cluster-replicas 0`` and waited on until every node
  reports ``cluster_state:ok`` and knows all its peers.
* `ReplicatedRedis`: a master and a replica (``--replicaof``), optionally watched by one
  Sentinel (quorum 1, short down-after and failover timeouts) started with
  ``redis-server sentinel.conf --sentinel``.

Every process is started by the helper that owns it and stopped (SIGTERM, then SIGKILL)
by its ``stop()`` / context exit, temporary directories included. Waiting is always a
poll with a deadline, never a fixed sleep.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

from tests.redis_server import free_port

HOST = "127.0.0.1"


def _wait(predicate: Callable[[], object], timeout: float, what: str,
          interval: float = 0.02) -> object:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (redis.RedisError, OSError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def _binary(name: str = "redis-server") -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"no {name} on PATH (apt-get install redis-server redis-tools)")
    return path


class _Process:
    """One redis-server (data node or sentinel) in its own directory."""

    def __init__(self, port: int, workdir: Path, args: list[str]) -> None:
        self.port = port
        self.dir = workdir
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "redis.log"

    def start(self) -> _Process:
        self.proc = subprocess.Popen(self.args, cwd=self.dir, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def client(self, **kwargs) -> redis.Redis:
        options = {"decode_responses": True, "socket_timeout": 2, "socket_connect_timeout": 1}
        options.update(kwargs)
        return redis.Redis(host=HOST, port=self.port, **options)

    def ping(self) -> bool:
        try:
            return bool(self.client(socket_timeout=0.5).ping())
        except (redis.RedisError, OSError):
            return False

    def wait_up(self, timeout: float = 10.0) -> None:
        def up() -> bool:
            if not self.alive():
                raise RuntimeError(f"redis-server on port {self.port} exited:\n{self.tail()}")
            return self.ping()

        _wait(up, timeout, f"redis-server on port {self.port}")

    def tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGCONT)  # a stopped (SIGSTOP) server
                self.proc.terminate()
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def _server_args(port: int, workdir: Path, *extra: str) -> list[str]:
    return [_binary(), "--port", str(port), "--bind", HOST, "--dir", str(workdir),
            "--save", "", "--appendonly", "no", "--daemonize", "no",
            "--logfile", str(workdir / "redis.log"), "--loglevel", "notice",
            "--repl-diskless-sync-delay", "0", *extra]


class LocalCluster:
    """A Redis Cluster of `shards` primaries (no replicas) on free ports."""

    def __init__(self, shards: int = 3) -> None:
        self.shards = shards
        self.root = Path(tempfile.mkdtemp(prefix="forq-cluster-"))
        self.nodes: list[_Process] = []

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{HOST}:{p}" for p in self.ports)

    def start(self, timeout: float = 30.0) -> LocalCluster:
        try:
            for i in range(self.shards):
                port, bus = free_port(), free_port()
                workdir = self.root / f"node{i}"
                workdir.mkdir()
                args = _server_args(port, workdir, "--cluster-enabled", "yes",
                                    "--cluster-config-file", str(workdir / "nodes.conf"),
                                    "--cluster-port", str(bus),
                                    "--cluster-node-timeout", "2000")
                self.nodes.append(_Process(port, workdir, args).start())
            for node in self.nodes:
                node.wait_up(timeout)
            if self.shards == 1:
                # redis-cli --cluster create wants 3 masters; one node takes every slot
                self.nodes[0].client().execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
            else:
                subprocess.run(
                    [_binary("redis-cli"), "--cluster", "create",
                     *(f"{HOST}:{p}" for p in self.ports),
                     "--cluster-replicas", "0", "--cluster-yes"],
                    check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    timeout=timeout)
            _wait(self._ready, timeout, "cluster_state:ok on every node")
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        for node in self.nodes:
            info = node.client().execute_command("CLUSTER", "INFO")
            if isinstance(info, dict):
                fields = {k: str(v) for k, v in info.items()}
            else:
                fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
            if (fields.get("cluster_state") != "ok"
                    or fields.get("cluster_known_nodes") != str(self.shards)
                    or fields.get("cluster_slots_assigned") != "16384"):
                return False
        return True

    def node_for_slot(self, slot: int) -> _Process:
        """The node serving `slot` (asked of the cluster, not computed)."""
        for start, end, primary, *_ in self.nodes[0].client().execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                port = int(primary[1])
                return next(n for n in self.nodes if n.port == port)
        raise LookupError(f"no node serves slot {slot}")

    def queue_per_node(self, prefix: str = "c", count: int | None = None) -> dict[int, str]:
        """Fresh queue names, one on each of `count` nodes (all by default), by port."""
        from redis.crc import key_slot

        by_node: dict[int, str] = {}
        while len(by_node) < (count or len(self.nodes)):
            name = prefix + uuid.uuid4().hex[:10]
            by_node.setdefault(self.node_for_slot(key_slot(name.encode())).port, name)
        return by_node

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ReplicatedRedis:
    """A master, one replica and (with ``sentinel=True``) one Sentinel watching them.

    The Sentinel uses quorum 1, ``down-after-milliseconds`` 1000 and a short failover
    timeout, so a SIGKILLed master is replaced within a few seconds.
    """

    MASTER_NAME = "forqmaster"

    def __init__(self, *, sentinel: bool = False, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="forq-replicated-"))
        self.with_sentinel = sentinel
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.master: _Process | None = None
        self.replica: _Process | None = None
        self.sentinel: _Process | None = None

    @property
    def url(self) -> str:
        """A plain URL of the current (initial) master."""
        assert self.master is not None
        return f"redis://{HOST}:{self.master.port}/0"

    @property
    def sentinel_url(self) -> str:
        assert self.sentinel is not None
        return f"redis+sentinel://{HOST}:{self.sentinel.port}/{self.MASTER_NAME}"

    def start(self, timeout: float = 20.0) -> ReplicatedRedis:
        try:
            mport, rport = free_port(), free_port()
            for name in ("master", "replica"):
                (self.root / name).mkdir()
            self.master = _Process(mport, self.root / "master",
                                   _server_args(mport, self.root / "master")).start()
            self.replica = _Process(rport, self.root / "replica", _server_args(
                rport, self.root / "replica", "--replicaof", HOST, str(mport),
                "--repl-ping-replica-period", "1")).start()
            self.master.wait_up(timeout)
            self.replica.wait_up(timeout)
            self.wait_replica_in_sync(timeout)
            if self.with_sentinel:
                self._start_sentinel(mport, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_replica_in_sync(self, timeout: float = 20.0) -> None:
        def synced() -> bool:
            info = self.replica.client().info("replication")
            master = self.master.client().info("replication")
            return (info.get("master_link_status") == "up"
                    and master.get("connected_slaves", 0) >= 1)

        _wait(synced, timeout, "the replica to sync with its master")

    def _start_sentinel(self, mport: int, timeout: float) -> None:
        sport = free_port()
        workdir = self.root / "sentinel"
        workdir.mkdir()
        conf = workdir / "sentinel.conf"
        name = self.MASTER_NAME
        conf.write_text(
            f"port {sport}\nbind {HOST}\ndir {workdir}\n"
            f"logfile {workdir / 'redis.log'}\n"
            f"sentinel monitor {name} {HOST} {mport} 1\n"
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {name} 1\n")
        self.sentinel = _Process(sport, workdir, [_binary(), str(conf), "--sentinel"]).start()
        self.sentinel.wait_up(timeout)
        rport = self.replica.port

        def knows_replica() -> bool:
            replicas = self.sentinel.client().execute_command("SENTINEL", "REPLICAS", name)
            for entry in replicas:
                fields = entry if isinstance(entry, dict) else dict(zip(entry[::2], entry[1::2], strict=False))
                if int(fields.get("port", 0)) == rport and "s_down" not in fields.get("flags", ""):
                    return True
            return False

        _wait(knows_replica, timeout, "the sentinel to discover the replica")

    def master_address(self) -> tuple[str, int]:
        """What the Sentinel reports as the master now."""
        assert self.sentinel is not None
        host, port = self.sentinel.client().execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.MASTER_NAME)
        return host, int(port)

    def wait_failover(self, timeout: float = 30.0) -> None:
        """After the master died: until the replica is master in its own eyes and the
        Sentinel's."""
        rport = self.replica.port

        def promoted() -> bool:
            return (self.master_address()[1] == rport
                    and self.replica.client().info("replication").get("role") == "master")

        _wait(promoted, timeout, "the sentinel to promote the replica", interval=0.05)

    def stop(self) -> None:
        for proc in (self.sentinel, self.replica, self.master):
            if proc is not None:
                proc.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ReplicatedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
