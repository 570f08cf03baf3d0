"""keyshot's shipped configs (YAML and JSON, one folder per command), installed as ``keyshot.configs`` so
that ``--config NAME`` finds them from any folder (:func:`keyshot.infer.common.config.resolve_config`)."""
