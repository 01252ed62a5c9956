"""Codecs of the Kubernetes streaming protocols.

:mod:`.spdy` is SPDY/3.1 (framing, header compression, an asyncio session
of streams) as the container runtimes' streaming servers and kubectl's
port-forward speak it; :mod:`.channels` holds the constants and helpers of
the channel protocols (``v4``/``v5.channel.k8s.io`` for exec and attach,
``portforward.k8s.io``). Nothing here knows about nodes or the API server.
"""
