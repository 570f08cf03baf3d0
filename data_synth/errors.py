"""Errors of the data-synthesis stage; each message names the file or setting it is about."""

from __future__ import annotations

from keyshot.infer.common.errors import KeyshotError


class SynthError(KeyshotError, ValueError):
    """Bad synthesis input: a config, a run folder or a source file that cannot be used."""


class LabelStoreError(SynthError):
    """A label store (``labels.jsonl``) that cannot be read or written."""


class RecordImportError(SynthError):
    """A WebJudge log record that cannot be imported as teacher labels."""
