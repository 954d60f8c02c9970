"""Scale-out on Ray Serve (``pip install aserve[ray]``; ``docs/scale-out.md``).

``app.py`` the application (replicas behind an ingress), ``replica.py`` one engine replica
hosting aserve's HTTP app, ``ingress.py`` the OpenAI endpoint that routes and relays,
``router.py`` Serve's request router running ``aserve/routing``'s policies, ``metrics.py``
the merged ``/metrics``, ``command.py`` ``aserve serve --ray``, ``builder.py`` for ``serve run``.
Importing this package imports nothing of Ray; its modules that need Ray import it.
"""
