"""A Ray cluster's address, checked before ``ray.init`` joins it: ``ray.init`` alone waits
minutes on an address nothing answers, so both paths that join a cluster (the write path's
``elmo embed --ray-address``, the read path's searches, serving and index refresh) first
open a TCP connection to it and fail within seconds, naming the fix.
"""

from __future__ import annotations

import socket

from elmo_model.errors import ElmoUserError

CONNECT_TIMEOUT_S = 10  # a TCP connect to the cluster's address, before ray.init waits on it


def require_reachable(address: str, fix: str) -> None:
    """A user error unless something listens at ``address`` (``HOST:PORT``,
    ``ray://HOST:PORT``, or ``auto``: the cluster this machine last started or
    ``$RAY_ADDRESS``)."""
    where = address.removeprefix("ray://")
    if address == "local":  # a Ray this process starts
        return
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            where = canonicalize_bootstrap_address("auto") or ""
        except (ConnectionError, ValueError, ImportError, AttributeError):
            where = ""  # ray.init says what is missing
        if not where:
            return
    host, sep, port = where.rpartition(":")
    if not sep or not port.isdigit():
        raise ElmoUserError(f"--ray-address {address} is not HOST:PORT, ray://HOST:PORT, auto "
                            "or local")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S):
            pass
    except OSError as error:
        raise ElmoUserError(f"no Ray cluster answers at {address} ({error.strerror or error}); "
                            f"{fix}") from None
