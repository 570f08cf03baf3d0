"""OpenRLHF's ``AgentExecutor`` for a :class:`~keyshot.frameworks.openrlhf.reward.KeyshotAgentInstance`: what an
agent file (``--train.agent_func_path``) subclasses, naming its instance class::

    class AgentExecutor(KeyshotAgentExecutor):
        agent_instance_cls = AgentInstance

It imports OpenRLHF (an agent file runs where OpenRLHF is installed); the instance base and the reward
function (:mod:`keyshot.frameworks.openrlhf.reward`) do not. Tested with OpenRLHF 0.11.2.
"""

from typing import Any

from openrlhf.utils.agent import MultiTurnAgentExecutor

from keyshot.frameworks.openrlhf.reward import KeyshotAgentInstance, openrlhf_logs, policy_image

__all__ = ["KeyshotAgentExecutor"]


class KeyshotAgentExecutor(MultiTurnAgentExecutor):
    """OpenRLHF's multi-turn executor with each rollout opened before its first turn and ended after its
    last, whichever way it ends.

    The OpenRLHF contract it depends on (0.11.2):

    - OpenRLHF's vLLM engine actor (``RolloutRayActor``) loads the agent file by path and builds its
      ``AgentExecutor`` once, with no arguments (``_load_agent_executor``); it then calls
      ``execute(prompt=, label=, sampling_params=, max_length=, hf_tokenizer=, llm_engine=, images=)``
      once per sample, many at once on one event loop (``generate_responses``: ``asyncio.gather``), and
      reads the dict it returns (``reward``, ``scores``, ``extra_logs`` and the tokens, images and action
      ranges the samples generator turns into an Experience).
    - ``MultiTurnAgentExecutor.execute`` (the turns; called here, for one opened agent, through
      :class:`_OpenedRollout`) builds its rollout's AgentInstance by calling ``agent_instance_cls()``
      once, then awaits ``reset({"observation": prompt, "label": label})`` once and reads
      ``observation``; it tokenizes that text with ``images`` (the only images of the first turn); then,
      while the token budget lasts, generates an action and awaits ``step({"observation_text",
      "action_text", "label", "sampling_params"})``, reading ``rewards`` (a tensor), ``scores``,
      ``environment_feedback``, ``environment_images``, ``done``, ``extra_logs`` and
      ``sampling_params``. It stops after a ``done`` step, or when ``max_length`` leaves no token to
      generate (no ``done`` step: the response's reward is the sum of the step rewards).

    What this executor adds around it, per sample: a fresh agent (:meth:`new_agent`) opened first (its
    first page's text joined to the prompt by ``first_prompt``, its screenshot after the dataset's
    images), so the first page reaches the policy; an episode the token budget stopped judged on what it
    recorded (``keyshot_unfinished`` 1.0); and the agent's ``end()`` on every way out (its environment
    closed once, an episode never judged removed), the task's cancellation included. What the executor
    itself holds for its agents (a pool of browsers) is released by :meth:`close`; OpenRLHF calls no
    teardown of its own (the engine's process ends).
    """

    #: The agent file's AgentInstance (a KeyshotAgentInstance and an OpenRLHF AgentInstanceBase).
    agent_instance_cls: type

    def __init__(self) -> None:
        cls = getattr(type(self), "agent_instance_cls", None)
        if not (isinstance(cls, type) and issubclass(cls, KeyshotAgentInstance)):
            raise TypeError(
                f"{type(self).__name__}: set agent_instance_cls to the agent file's AgentInstance (a subclass "
                "of keyshot's KeyshotAgentInstance and OpenRLHF's AgentInstanceBase)"
            )
        super().__init__(cls)  # OpenRLHF's own check: an AgentInstanceBase

    def new_agent(self, label: Any) -> KeyshotAgentInstance:
        """The agent of one rollout (``label``'s): ``agent_instance_cls()``. Override it to hand the agent
        what the executor holds for all of them (a pool of browsers)."""
        return self.agent_instance_cls()

    def close(self) -> None:
        """Release what the executor holds for its agents (nothing here; a pool of browsers in a
        subclass). Each rollout's own environment is closed at its end, not here."""

    async def execute(
        self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None
    ) -> dict[str, Any]:
        agent = self.new_agent(label)
        try:
            page = await agent.open(label)
            if page.screenshot is not None:
                given = images if isinstance(images, list) else [images] if images else []
                images = [*given, policy_image(page.screenshot)]
            response = await _OpenedRollout(agent).execute(
                agent.first_prompt(prompt, page),
                label,
                sampling_params,
                max_length,
                hf_tokenizer,
                llm_engine,
                images=images,
            )
            if agent.result is None:  # the token budget ran out before a done step
                result = await agent.judge(None)
                response.update(
                    reward=float(result.reward),
                    scores=float(result.reward),
                    extra_logs=openrlhf_logs([result], True),
                )
            return response
        finally:
            await agent.end()


class _OpenedRollout(MultiTurnAgentExecutor):
    """OpenRLHF's turns (``MultiTurnAgentExecutor.execute``) for one agent that
    :class:`KeyshotAgentExecutor` has opened: that loop builds its rollout's instance by calling
    ``agent_instance_cls()``, and here the one call hands it the opened agent. A second call would mean an
    OpenRLHF whose loop builds more than one instance per rollout, which this executor does not support:
    it raises instead of opening a fresh environment."""

    def __init__(self, agent: KeyshotAgentInstance) -> None:
        # no super().__init__(): it would set agent_instance_cls, which is the method below
        self._agent: KeyshotAgentInstance | None = agent

    def agent_instance_cls(self) -> KeyshotAgentInstance:
        agent, self._agent = self._agent, None
        if agent is None:
            raise RuntimeError(
                "keyshot's AgentExecutor: OpenRLHF asked for a second AgentInstance in one rollout; this "
                "executor supports OpenRLHF 0.11's MultiTurnAgentExecutor.execute, which builds one"
            )
        return agent
