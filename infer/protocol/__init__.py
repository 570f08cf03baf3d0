"""The WebJudge protocol as data and pure functions: prompt sets (with their version), the chat messages
of the three calls, the image policy, the scorer's chat template with training labels, the answer
parsers (score digit, status, key points) and the verdict record with its keep rule.

May import: ``keyshot.infer.common`` only. Synthesis, training and judging all build on this room, so
the same screenshot and task give the same bytes wherever they are sent from.
"""
