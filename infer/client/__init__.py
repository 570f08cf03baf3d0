"""Every LLM call: the endpoint config and request body, the openai transport, reading replies and
the retry policy, the circuit breaker, the persistent call cache, usage and cost, the scorer pool,
and the preflight check before a run spends anything.

May import: ``common``, ``protocol``.
"""
