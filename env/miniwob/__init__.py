"""Live MiniWoB pages in Chromium, one module per role: ``setup`` (Chromium, playwright, MiniWoB's pages
and tiktoken, prepared once per process), ``client`` (:class:`MiniWoBBrowser`, the browser object that
talks to its worker), ``worker`` (the process that runs BrowserGym's environment), ``budget`` (how many
live pages this machine holds), ``pool`` (browsers shared by environments, opened ahead and reused) and
``agents`` (scripted players). ``python -m keyshot.env.miniwob [TASK]`` checks the set-up."""
