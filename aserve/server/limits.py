"""Per-request limits of the HTTP server (a light module: ``aserve serve --help`` imports it)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BodyLimits:
    """What a request body may cost: its size (413 beyond) and how long it may take to
    arrive (408 beyond: a client that sends headers and part of a body, then waits, would
    otherwise hold its connection and request task for as long as it likes).

    ``sse_keepalive_s`` rides along (it travels to every front end the same way): the
    longest an SSE stream stays silent before a ``: keep-alive`` comment line, so proxies
    with an idle timeout do not cut a stream that waits in the queue or between tokens.

    So does ``idle_connection_s``: how long a kept-alive connection may wait for its next
    request before the server closes it (Hypercorn also counts a new connection idle until
    its request's headers are complete: the same bound holds a client that sends nothing).
    It must outlast the clients' own expiry (httpx's, so the openai client's, is 5 s;
    aiohttp's 15 s): a server that closes first races the client's next request on that
    connection, and the client meets a ``ReadError`` with nothing in the server's log
    (Hypercorn's 5 s did, under load: issue 14's dropped stream). 20 s outlasts both. It is
    not longer because Hypercorn (0.18) holds a connection the client has closed until this
    timer ends (the connection's task group waits on its idle task), so each closed connection
    keeps a socket in CLOSE-WAIT for up to this long: 75 s kept a soak's closed connections
    open past its 30 s settle."""

    max_bytes: int = 1 << 20
    timeout_s: float = 30.0
    sse_keepalive_s: float = 5.0
    idle_connection_s: float = 20.0


DEFAULT_BODY_LIMITS = BodyLimits()
