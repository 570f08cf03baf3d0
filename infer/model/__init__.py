"""The scorer model as files: self-describing checkpoints (keyshot.json), the tiny random Qwen2.5-VL
used by tests and the demo, and the batched vision attention.

May import: ``common``, ``protocol``.
"""
