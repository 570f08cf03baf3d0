"""Engines that run keyshot's pipeline somewhere else than in one process: Ray Data over a cluster
(:mod:`~keyshot.infer.engines.ray_engine`, the cluster it runs on: :mod:`~keyshot.infer.engines.ray_cluster`).
An engine schedules only: the steps, clients, caches and records are the one-process run's.

May import: ``common``, ``protocol``, ``client``.
"""
