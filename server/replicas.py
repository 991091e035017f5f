"""The replicas of one variant: the engines that serve it, and which of them takes the next request.

``serve --replicas dense=2`` starts two vLLM engines of ``dense`` (own ports; on a GPU machine own cards),
each a :class:`~server.backends.Backend` that the pool health-checks and restarts on its own. The router and
the proxy see the variant as one :class:`ReplicaSet`: it is up while any replica is up, and
:meth:`~ReplicaSet.choose_replica` picks the replica for a request.

The choice is the replica with the fewest requests outstanding (sent by this gateway and not yet answered),
ties broken round-robin. LLM requests differ in length by orders of magnitude, so plain round-robin keeps
sending every other request to an engine that is still busy with long generations while its sibling idles;
outstanding requests are what the gateway knows exactly and for free, and they track an engine's load
(its running and waiting sequences). Round-robin among the tied spreads a burst that arrives at an idle
variant evenly. A replica that is down is out of rotation until a health check finds it up again.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Protocol

from server.settings import BackendSpec


class Replica(Protocol):
    """What a variant's state and the choice read of a replica: a :class:`server.backends.Backend` (the
    pool there builds the replica sets, so this module does not import it back)."""

    name: str
    replica: int
    spec: BackendSpec
    managed: bool
    up: bool
    restarting: bool
    restarts: int
    last_error: str | None
    url: str
    max_model_len: int | None
    outstanding: int

    def status(self) -> dict: ...


class ReplicaSet:
    """One variant as the router sees it: its replicas (engines) and the choice among them."""

    def __init__(self, replicas: list[Replica]):
        if not replicas:
            raise ValueError("a variant has at least one replica")
        self.replicas = replicas
        self._turn = itertools.count()

    @property
    def name(self) -> str:
        """The variant's name (clients' ``model``)."""
        return self.replicas[0].name

    @property
    def spec(self) -> BackendSpec:
        """The variant's spec (shared by its replicas)."""
        return self.replicas[0].spec

    @property
    def managed(self) -> bool:
        """True when this gateway starts the engines."""
        return self.replicas[0].managed

    @property
    def up(self) -> bool:
        """True while at least one replica answers: the variant can be served."""
        return any(replica.up for replica in self.replicas)

    @property
    def restarting(self) -> bool:
        """True when no replica is up and one is being restarted."""
        return not self.up and any(replica.restarting for replica in self.replicas)

    @property
    def last_error(self) -> str | None:
        """Why the variant cannot be served (the first replica's error), None while one is up."""
        if self.up:
            return None
        return next((replica.last_error for replica in self.replicas if replica.last_error), None)

    @property
    def url(self) -> str:
        """URL of the first replica that is up (else the first's): where ``/metrics/backends`` reads."""
        return next((replica.url for replica in self.replicas if replica.up), self.replicas[0].url)

    @property
    def max_model_len(self) -> int | None:
        """The shortest context any replica reports (all run with the same ``--max-model-len``)."""
        known = [replica.max_model_len for replica in self.replicas if replica.max_model_len is not None]
        return min(known) if known else None

    @property
    def restarts(self) -> int:
        """Restarts of all replicas together."""
        return sum(replica.restarts for replica in self.replicas)

    def choose_replica(self, exclude: Iterable[Replica] = ()) -> Replica | None:
        """The replica for the next request: up, fewest outstanding requests, round-robin among ties.

        Args:
            exclude: replicas already tried for this request (their connection was refused).

        Returns:
            The replica, or None when no replica outside ``exclude`` is up.
        """
        skipped = set(map(id, exclude))
        candidates = [replica for replica in self.replicas if replica.up and id(replica) not in skipped]
        if not candidates:
            return None
        fewest = min(replica.outstanding for replica in candidates)
        tied = [replica for replica in candidates if replica.outstanding == fewest]
        return tied[next(self._turn) % len(tied)]

    def status(self) -> dict:
        """State shown by ``/ready`` and ``serve``: the one engine's status, or with several replicas the
        variant's state and each replica's."""
        if len(self.replicas) == 1:
            return self.replicas[0].status()
        return {
            "up": self.up,
            "replicas_up": sum(replica.up for replica in self.replicas),
            "managed": self.managed,
            "restarts": self.restarts,
            "error": self.last_error,
            "replicas": [{"replica": replica.replica, **replica.status()} for replica in self.replicas],
        }


__all__ = ["ReplicaSet"]
