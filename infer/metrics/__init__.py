"""Judge-versus-truth metrics: success rate, agreement and SR gap (Online-Mind2Web), precision /
recall / F1 (AgentRewardBench), their files (Markdown, CSV, JSON, PNG) and ``keyshot metrics``.

May import: ``common``, ``protocol``, ``loaders``, ``runs``.
"""
