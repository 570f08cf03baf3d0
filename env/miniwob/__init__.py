"""Live MiniWoB pages in Chromium: ``browser`` (the client, its set-up, scripted agents) and ``worker`` (the
process that runs BrowserGym's environment)."""
