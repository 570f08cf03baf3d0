"""keyshot's error classes and exit codes: what the CLI prints as one line, and the code it exits with.

Exit codes of every keyshot command:

======  =========================================================================================
0       the job did what was asked: every input judged or listed with the reason it was not
1       a bug (a traceback was printed)
2       a user mistake (bad config, bad path, a second writer on a run folder, a max_tokens that cuts
        every first answer of a run ...): one line says which file or field, what is wrong and what to do
3       incomplete: some trajectories need calls that failed; re-run the same command to retry them
4       an endpoint is down (the circuit breaker tripped); re-run once it answers
5       a spending cap was reached; re-run with a larger budget to finish
6       preflight: an endpoint is unreachable, its key missing or refused, or its model not served
128+N   stopped by signal N (SIGINT 130, SIGTERM 143); partial results are flushed, re-run resumes;
        141 (SIGPIPE's): the output was closed by its reader (``keyshot metrics ... | head -1``), quietly
======  =========================================================================================
"""

from __future__ import annotations

import os
import select
import signal
import sys

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INCOMPLETE = 3
EXIT_ENDPOINT_DOWN = 4
EXIT_BUDGET = 5
EXIT_PREFLIGHT = 6
#: The output's reader closed it (``| head``): as a shell reports a process SIGPIPE ended.
EXIT_CLOSED_OUTPUT = 128 + signal.SIGPIPE


class KeyshotError(Exception):
    """A user-facing error: the CLI prints its message as one line and exits with ``exit_code``.

    Every error about the user's input, config, files or environment derives from it (config, trajectory,
    image, verdict file, checkpoint, serve, cache, synthesis, training set-up ...), so a command needs one
    ``except KeyshotError``; anything else reaching the top is a bug and keeps its traceback."""

    exit_code = EXIT_USAGE


class RunStopError(KeyshotError, RuntimeError):
    """Stops a whole run (not one trajectory): a spent budget, an endpoint that is down. A user-facing
    error like any other: reaching the top, it is one line and its exit code.

    Trajectories in flight are not written; a re-run of the same command judges them."""

    exit_code = EXIT_INCOMPLETE
    #: what the run's log adds to the message when it stops
    advice = "re-run the same command to finish"


class EndpointDownError(RunStopError):
    """The circuit breaker of an endpoint tripped: ``failures`` requests in a row failed."""

    exit_code = EXIT_ENDPOINT_DOWN

    def __init__(self, name: str, url: str, failures: int, last_error: str):
        self.endpoint = name
        self.url = url
        self.failures = failures
        self.last_error = last_error
        super().__init__(
            f"endpoint {name!r} at {url} is down: {failures} requests in a row failed (last: {last_error}); "
            "check the server, the model name and the API key, then re-run the same command to resume"
        )


def raise_advice(setting: str, cut_tokens: int = 0, trained_tokens: int | None = None) -> str:
    """What to do about answers cut under ``setting``: raise it; a judge's limit is part of the run's
    protocol (``run.json``), so its verdicts go to a new folder. A scorer cut at or past the longest
    answer its checkpoint was trained on (``trained_tokens``) does not end its answers: raising the
    limit would only pay for longer answers."""
    if trained_tokens and cut_tokens >= trained_tokens:
        return (
            f"{setting} already allows the longest answer the scorer's checkpoint was trained on "
            f"({trained_tokens} tokens), so the model does not end its answers as it was taught: check the "
            "checkpoint (too few training steps, or another chat template than its training's) before "
            "raising the limit"
        )
    if setting == "judge.max_tokens":
        return "raise judge.max_tokens and judge into a new --out (the run folder's protocol records it)"
    return f"raise {setting} and re-run the same command"


class CutAnswersError(RunStopError):
    """The first answers under one token limit were all cut by it (docs/architecture.md, "A verdict needs evidence"): the limit is
    too small for the model, every later answer would be cut too, so the run stops before paying for
    them. A configuration error: its exit code is the usage one."""

    exit_code = EXIT_USAGE
    advice = ""

    def __init__(
        self,
        setting: str,
        answers: int,
        cut_tokens: int,
        longest_tokens: int,
        trained_tokens: int | None = None,
    ):
        self.setting = setting
        super().__init__(
            f"the first {answers} answers under {setting} were all cut by max_tokens (at up to {cut_tokens} "
            f"completion tokens; the longest answer seen: {longest_tokens} tokens): the model answers at more "
            f"length than {setting} allows; {raise_advice(setting, cut_tokens, trained_tokens)}"
        )


def error_exit(exc: BaseException, prog: str, *, debug: bool = False) -> int:
    """The one place an error becomes its line and exit code (every command runs under
    :func:`keyshot.infer.cli.run_parsed`): a :class:`KeyshotError` (a :class:`RunStopError` included) is
    ``PROG: error: MESSAGE`` on stderr and its ``exit_code``; anything else is a bug and is raised again
    with its traceback (exit 1), as is every error under ``--debug``."""
    if debug or not isinstance(exc, KeyshotError):
        raise exc
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return exc.exit_code


def output_closed() -> bool:
    """True when standard output is a pipe whose reader has gone (``| head`` read what it wanted): a
    BrokenPipeError from it is not a bug, unlike one from a socket."""
    try:
        poll = select.poll()
        poll.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # no real file (captured output), no poll
        return False


def closed_output_exit() -> int:
    """End quietly once the reader closed the output, the way Python's documentation advises (the
    ``signal`` module's note on SIGPIPE): standard output goes to devnull, so that the flush at exit
    raises nothing, and the code is SIGPIPE's 141 (:data:`EXIT_CLOSED_OUTPUT`)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_OUTPUT


class Interrupted(KeyboardInterrupt):
    """SIGINT/SIGTERM arrived: unwind (flushing files, stopping servers) and exit 128+signal.

    A KeyboardInterrupt so that asyncio propagates it out of a running loop (other BaseExceptions
    raised in a callback are only logged)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by signal {signum}")


def require_training_stack(what: str) -> None:
    """Refuse, with the install command, a job that needs torch and transformers on a core install."""
    import importlib

    missing = []
    for module in ("torch", "transformers"):  # torch first: transformers without it only warns
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
            break
    if missing:
        raise KeyshotError(
            f"{what} needs {' and '.join(missing)}, which this install lacks: pip install 'keyshot[train]' "
            "(the core install judges with remote or served models only)"
        )
