"""Live MiniWoB pages in Chromium, one module per role: ``setup`` (Chromium, playwright, MiniWoB's pages
and tiktoken, prepared once per process), ``client`` (:class:`MiniWoBBrowser`, one session: a page in a
browser context of its own; :class:`BrowserProcess`, one Chromium holding many sessions), ``worker`` (the
process that drives a Chromium through BrowserGym's MiniWoB tasks), ``budget`` (how many live pages this
machine holds, from measured figures), ``pool`` (sessions leased on shared Chromium processes within the
budget) and ``agents`` (scripted players). ``python -m keyshot.env.miniwob [TASK]`` checks the set-up."""
