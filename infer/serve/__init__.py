"""``keyshot serve``: a serve config checked against its checkpoint and turned into vLLM's command line
(``plan``), the server process (``command``) and the guard that ends it with keyshot.

May import: ``common``, ``protocol``, ``model``, ``client``.
"""
