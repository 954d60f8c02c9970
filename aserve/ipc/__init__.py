"""The engine core and its HTTP front ends in separate processes, over ZeroMQ.

``aserve serve --api-workers N`` runs the engine core (the step loop, unchanged) in the main
process and the Starlette app on Hypercorn in N worker processes. A front end tokenizes and
validates its own requests, and detokenizes, renders and streams its own outputs; the core
sends each front end one message per step with every new token of its requests.

* ``messages.py``: the wire format (msgspec structs, msgpack; nothing is pickled).
* ``core.py``: the core's side: a ROUTER socket, requests in, one outputs message per front end per step.
* ``client.py``: the front end's side, ``EngineClient``, which the server uses like an ``Engine``.
* ``launcher.py``: the processes: the shared listening socket, start, supervision, drain.
"""
