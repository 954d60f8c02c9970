"""Routing requests among engine replicas: plain Python on plain data (no Ray, no torch).

``prefix.py`` turns a request body into a chain of prompt-block hashes and keeps the
router's approximate view of which replica caches which blocks; ``policy.py`` chooses a
replica (prefix affinity, round-robin, least-loaded). The Ray Serve request router
(``aserve/ray/router.py``) and the scale-out simulator (``loadgen/simulate.py``) both call
the same policies.
"""
