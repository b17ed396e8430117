"""Workers as Ray actors across a cluster's nodes (`--runner ray`).

Each actor runs the worker loop a local worker process runs (engine/worker.py), in a thread
between two in-process queues. The pool talks to an actor one call at a time:
exchange(pages, finish, stop) hands it the pages assigned since the last call and returns
what its worker said since (waiting a little for the first message; a worker ticks every
100 ms). The coordinator's pages-out limit bounds what is in flight; the pool sends each page
to the actor with the fewest unfetched pages, and waits on all outstanding calls at once
(ray.wait).

Faults: the pool keeps, per actor, the pages it sent that no durable report covers yet. When
a call fails because the actor died (its process killed, its node gone), the coordinator gets
("lost", worker, those pages, how many were unfetched, why) and sends them to the others, and
a new actor, with a new worker number (tar shards are named by it), takes the dead one's
place while the cluster has a free CPU. Only when no actor is left does the run stop.

An actor alive to Ray but silent to us (stopped, a GC pause, a hung mount, a node cut off)
answers no call: its pages would wait for it forever. Each answer renews its lease; once
--lease seconds pass without one, it is killed, and its pages go to the others when Ray
says it died (so it never writes after they went), or after a second --lease when the kill
cannot reach it (a node cut off: the tar index fences it, dest/index.py).

DEST must be storage every node sees: the pool checks that at the start with a probe file
each node must read back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bulkfetch.config import GetOptions
from bulkfetch.engine.worker import worker_main
from bulkfetch.errors import UsageError
from bulkfetch.models import Page
from bulkfetch.runners.holdings import Holding, LeaseClock, Message
from bulkfetch.runners.pool import take_all
from bulkfetch.runners.rate_shares import Shares

EXCHANGE_WAIT_S = 0.5  # an actor's reply waits at most this for its worker's first message
START_TIMEOUT_S = 120.0  # for the probes and the first actors to answer
REPLACE_WAIT_S = 30.0  # with every actor lost: how long a free CPU for another may take
PASSED_ENV = ("AWS_", "BULKFETCH_")  # the driver's variables the actors need (credentials)
INSTALL = "--runner ray needs Ray: pip install 'bulkfetch[ray]'"


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UsageError(INSTALL) from None
    return ray


class RayWorker:
    """One worker on a Ray node: a Fetcher and a sink, in a thread of the actor's process."""

    def __init__(self, worker: int, options: GetOptions) -> None:
        self.tasks: queue.Queue[Page | None] = queue.Queue()
        self.results: queue.Queue[Message] = queue.Queue()
        self.stop = threading.Event()
        equal = 1.0 / options.limits.workers
        self.share = (equal, equal)  # of --limit-rate and --max-rps, as the driver moves them
        # the actor's parent is the node's raylet: when it is gone the worker stops
        self.thread = threading.Thread(
            target=worker_main, name=f"bulkfetch-worker-{worker}", daemon=True,
            args=(worker, options, self.tasks, self.results, self.stop, os.getppid()),
            kwargs={"own_signals": False, "share": lambda: self.share})
        self.thread.start()

    def node_id(self) -> str:
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def exchange(self, pages: list[Page], finish: bool, stop: bool,
                 share: Shares | None = None) -> list[Message]:
        if share is not None:
            self.share = share
        for page in pages:
            self.tasks.put(page)
        if stop:
            self.stop.set()
        if finish:
            self.tasks.put(None)
        return take_all(self.results, EXCHANGE_WAIT_S)


def _sees(path: str, token: str) -> bool:
    """On one node: does DEST's probe file hold the driver's token?"""
    try:
        return Path(path).read_text() == token
    except OSError:
        return False


@dataclass
class _Actor(Holding):
    worker: int
    handle: Any
    node_ref: Any = None  # its node_id() call, asked at creation, read when needed
    node: str = ""
    call: Any = None  # the outstanding exchange's ObjectRef
    ready: bool = False  # it has answered once (a replacement may wait for a node)
    pending: list[Page] = field(default_factory=list)  # assigned, not handed over yet
    finish: bool = False
    finish_sent: bool = False
    stop: bool = False
    exited: bool = False
    dead: bool = False
    share: Shares | None = None  # of --limit-rate and --max-rps, sent with each exchange


class RayPool:
    """Actors on a Ray cluster, one per CPU unless --workers caps them."""

    def __init__(self, options: GetOptions) -> None:
        self.ray = import_ray()
        self.started_ray = False
        self._connect(options.runner.ray_address)
        cpus = int(self.ray.cluster_resources().get("CPU", 0))
        if cpus < 1:
            raise UsageError("the Ray cluster has no CPU for a worker")
        wanted = options.limits.workers if options.runner.workers_given else cpus
        self.size = min(wanted, cpus)
        # the coordinator's pages-out limit follows the number of actors
        self.options = dataclasses.replace(
            options, limits=dataclasses.replace(options.limits, workers=self.size))
        self.actors: dict[int, _Actor] = {}
        self.by_call: dict[Any, _Actor] = {}
        self.finishing = False
        self.gone_why: str | None = None
        self.said: list[Message] = []  # the pool's own messages, given with the next receive
        self.missing = 0  # actors lost and not replaced yet
        self.next_room_check = 0.0
        self.empty_since: float | None = None
        self.clock = LeaseClock(options.runner.lease_s)
        # The actors' working directory is not ours: they get absolute paths (the driver
        # keeps the options as given, which its journal's fingerprint holds).
        self.actor_options = dataclasses.replace(
            self.options, dest=os.path.abspath(options.dest),
            source=os.path.abspath(options.source) if options.from_file else options.source)
        self._check_dest(Path(self.actor_options.dest))
        env = {name: value for name, value in os.environ.items()
               if name.startswith(PASSED_ENV)}
        self.actor_class = self.ray.remote(RayWorker).options(
            num_cpus=1, max_restarts=0, max_task_retries=0, scheduling_strategy="SPREAD",
            runtime_env={"env_vars": env} if env else None)

    # -- cluster --------------------------------------------------------------------------
    def _connect(self, address: str | None) -> None:
        ray = self.ray
        if ray.is_initialized():
            return
        quiet = {"logging_level": logging.WARNING, "log_to_driver": True}
        try:
            if address is None and not os.environ.get("RAY_ADDRESS"):
                ray.init(include_dashboard=False, **quiet)
                self.started_ray = True
            else:
                ray.init(address=address, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = address or os.environ.get("RAY_ADDRESS")
            raise UsageError(f"cannot reach the Ray cluster at {where}: {exc}; start one "
                             "with `ray start --head` or give --ray-address") from None

    def _check_dest(self, dest: Path) -> None:
        """Every node must see DEST: a probe file written here, read back on each node."""
        ray = self.ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        probe = dest / ".bulkfetch" / f"probe-{secrets.token_hex(8)}"
        token = secrets.token_hex(16)
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text(token)
        try:
            nodes = [node for node in ray.nodes() if node.get("Alive")]
            sees = ray.remote(_sees)
            calls = {
                sees.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                    node["NodeID"], soft=False)).remote(str(probe), token):
                    self._node_label(node["NodeID"])
                for node in nodes}
            ready, _ = ray.wait(list(calls), num_returns=len(calls), timeout=START_TIMEOUT_S)
            blind = []
            for ref, label in calls.items():
                if ref not in ready:
                    blind.append(f"{label}: no answer")
                    continue
                try:
                    if not ray.get(ref):
                        blind.append(label)
                except ray.exceptions.TaskUnschedulableError:
                    continue  # a node that left after ray.nodes() said it is alive
                except ray.exceptions.RayError as exc:
                    blind.append(f"{label}: {type(exc).__name__}")
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
        if blind:
            raise UsageError(
                f"DEST {str(dest)!r} is not seen by every Ray node (not by "
                f"{', '.join(sorted(set(blind)))}): the workers write it, so it must be on "
                "storage every node mounts at the same path (a shared filesystem)")

    # -- WorkerPool -----------------------------------------------------------------------
    def start(self) -> None:
        for worker in range(self.size):
            self._add_actor(worker)
        deadline = time.monotonic() + START_TIMEOUT_S
        for actor in self.actors.values():  # placed and answering, or a clear error
            try:
                node = self.ray.get(actor.node_ref,
                                    timeout=max(1.0, deadline - time.monotonic()))
            except self.ray.exceptions.GetTimeoutError:
                self.kill()
                raise UsageError(f"Ray did not start {self.size} workers within "
                                 f"{START_TIMEOUT_S:.0f} s (is the cluster busy?)") from None
            actor.node = self._node_label(node)
            actor.ready = True

    def _node_label(self, node_id: str) -> str:
        """'IP node 1a2b3c4d': nodes of one machine share an IP, never an ID."""
        for node in self.ray.nodes():
            if node.get("NodeID") == node_id:
                return f"{node.get('NodeManagerAddress', '?')} node {node_id[:8]}"
        return f"node {node_id[:8]}"

    def _add_actor(self, worker: int) -> _Actor:
        handle = self.actor_class.remote(worker, self.actor_options)
        actor = _Actor(worker, handle, handle.node_id.remote())
        self.actors[worker] = actor
        self._call(actor)
        return actor

    def _call(self, actor: _Actor) -> None:
        """Start the actor's next exchange (there is at most one outstanding)."""
        if actor.call is not None or actor.exited or actor.dead:
            return
        finish = actor.finish and not actor.finish_sent
        actor.call = actor.handle.exchange.remote(actor.pending, finish, actor.stop,
                                                  actor.share)
        actor.finish_sent = actor.finish_sent or finish
        actor.pending = []
        self.by_call[actor.call] = actor

    def _live(self) -> list[_Actor]:
        return [actor for actor in self.actors.values() if not actor.exited and not actor.dead]

    def send(self, page: Page) -> None:
        candidates = [actor for actor in self._live() if actor.ready] or self._live()
        if not candidates:  # dead() says so; the page stays unjournaled for the rerun
            return
        actor = min(candidates, key=lambda a: (a.unfetched, a.call is not None))
        actor.pending.append(page)
        actor.give(page)
        self._call(actor)

    def receive(self, timeout: float) -> list[Message]:
        messages, self.said = self.said, []
        self._replace()
        for actor in self._live():
            self._call(actor)
        calls = list(self.by_call)
        if not calls:
            if not messages:
                time.sleep(timeout)
            return messages
        ready, _ = self.ray.wait(calls, num_returns=1, timeout=0 if messages else timeout)
        if ready:
            ready, _ = self.ray.wait(calls, num_returns=len(calls), timeout=0)
        for call in ready:
            actor = self.by_call.pop(call)
            actor.call = None
            try:
                answer = self.ray.get(call)
            except self.ray.exceptions.RayError as exc:
                messages += self._lost(actor, exc if actor.lapsed is None
                                       else TimeoutError(self.clock.why()))
                continue
            actor.ready = True  # a replacement's first answer: it has a node now
            actor.exited = actor.hear(answer, time.monotonic()) or actor.exited
            messages += answer
            if actor.exited and actor.held and not self.finishing:
                # it stopped by itself holding pages: its node's raylet is gone (a worker
                # whose parent dies stops), or a fatal error, which stops the run anyway
                messages += self._lost(actor, ConnectionError(
                    "it stopped by itself: the Ray raylet of its node is gone"))
            self._call(actor)
        return messages + self._lapse()

    def _lapse(self) -> list[Message]:
        """Kill each actor silent past its lease; give away the pages of one whose kill Ray
        has not confirmed within another lease."""
        now, lost = self.clock.look(self._live()), []
        for actor in self._live():
            if not actor.ready or actor.call is None:
                continue
            if self.clock.silent(actor, now):
                actor.lapsed = now
                with contextlib.suppress(Exception):
                    self.ray.kill(actor.handle, no_restart=True)
            elif self.clock.unanswered(actor, now):
                self.by_call.pop(actor.call, None)
                actor.call = None
                lost += self._lost(actor, TimeoutError(self.clock.why()))
        return lost

    def _lost(self, actor: _Actor, exc: Exception) -> list[Message]:
        said_exit, actor.dead = actor.exited, True
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        why = f"{type(exc).__name__}: {why[:200]}"
        lost = [actor.surrender(actor.worker, why)]
        if not said_exit:
            lost.append(("exit", actor.worker))
        with contextlib.suppress(Exception):
            self.ray.kill(actor.handle, no_restart=True)
        self.missing += 1
        self.gone_why = why
        self._replace()
        return lost

    def _replace(self) -> None:
        """Start actors for the lost ones while the cluster has a free CPU. Ray frees a dead
        actor's CPU a moment after its death is known, so this is tried again each second."""
        now = time.monotonic()
        if self.finishing or not self.missing or now < self.next_room_check:
            return
        self.next_room_check = now + 1.0
        try:
            free = int(self.ray.available_resources().get("CPU", 0))
        except Exception:
            return
        for _ in range(min(free, self.missing)):
            self.missing -= 1
            self.size += 1
            self._add_actor(self.size - 1)

    def dead(self) -> str | None:
        """Every actor is gone and none could take their place for a while."""
        if self._live() or self.gone_why is None:
            self.empty_since = None
            return None
        now = time.monotonic()
        if self.empty_since is None:
            self.empty_since = now
        if now - self.empty_since < REPLACE_WAIT_S:
            return None
        return (f"every Ray worker is gone and the cluster had no CPU for another within "
                f"{REPLACE_WAIT_S:.0f} s (the last: {self.gone_why})")

    def all_gone(self) -> bool:
        return not self._live()

    def finish(self, stop_now: bool) -> None:
        self.finishing = True
        for actor in self._live():
            if not actor.ready:  # a replacement still waiting for a node: never needed
                actor.dead = True
                with contextlib.suppress(Exception):
                    self.ray.kill(actor.handle, no_restart=True)
                self.said.append(("exit", actor.worker))
                continue
            actor.finish = True
            actor.stop = actor.stop or stop_now
            self._call(actor)

    def join(self) -> None:
        """The workers have said they exit (or the drain gave up): end the actors."""
        for actor in self.actors.values():
            with contextlib.suppress(Exception):
                self.ray.kill(actor.handle, no_restart=True)

    def kill(self) -> None:
        self.join()

    def share_rate(self, shares: dict[int, Shares]) -> None:
        for worker, share in shares.items():
            actor = self.actors.get(worker)
            if actor is not None:
                actor.share = share

    def where(self, worker: int) -> str:
        """For the report: replacements' nodes are looked up only now."""
        actor = self.actors.get(worker)
        if actor is None:
            return ""
        if not actor.node:
            with contextlib.suppress(Exception):
                actor.node = self._node_label(self.ray.get(actor.node_ref, timeout=5))
        return actor.node

    def close(self) -> None:
        if self.started_ray:
            with contextlib.suppress(Exception):
                self.ray.shutdown()
