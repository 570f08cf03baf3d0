"""What every floor of keyshot uses: error classes and exit codes, typed configs with ``key=value``
overrides, atomic files, logging set-up, secret redaction, help-text formatting, process checks.

May import: nothing of keyshot.
"""
