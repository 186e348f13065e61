"""A visitor's first request without rebuilding the page's config (issue 50.8).

Gradio builds a session's state (``gradio.state_holder.SessionState``) on the first request
of every session, on the server's event loop: it asks every component of the page for its
config (``BlocksConfig.config_for_block``: ``get_config``, which reads each constructor's
signature). On this app's 259 components that is 31-40 ms idle and 0.2-0.4 s on the loaded
2-core machine, during which no other request moves: 34 Trust requests, each an API call of
its own session, held the first Align click behind them for 4-6 s (12-18x its idle time;
a profile of the server put 78 % of the event loop's time in it).

:func:`remember_initial_configs` computes each component's initial config once, when the
server starts; a new session copies them (two levels deep: Gradio writes a session's values
into ``props``). A component a session replaced (an event's update), or one rendered later,
is read as Gradio reads it.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from gradio.blocks import BlocksConfig


def _fresh(config: dict) -> dict:
    """A session's own copy of a remembered config (its ``props`` apart)."""
    return {**config, "props": dict(config["props"])} if "props" in config else dict(config)


class _RememberedConfig(BlocksConfig):
    """The page's blocks config, with its components' initial configs remembered (and
    passed on to the per-session copies Gradio makes)."""

    _initial: dict[int, tuple[Any, dict]]

    def config_for_block(self, _id: int, rendered_ids: list[int], block: Any,  # type: ignore[override]
                         renderable: Any = None) -> dict:
        known = self._initial.get(_id)
        if known is not None and known[0] is block and not rendered_ids and renderable is None:
            return _fresh(known[1])
        return BlocksConfig.config_for_block(_id, rendered_ids, block, renderable)

    def __copy__(self) -> _RememberedConfig:
        new = super().__copy__()
        new.__class__ = _RememberedConfig
        new._initial = self._initial
        return new


def remember_initial_configs(blocks: gr.Blocks) -> None:
    """Have every new session of ``blocks`` copy its components' initial configs, computed
    now, instead of rebuilding them (module docstring). Call it once the page is built."""
    config = blocks.default_config
    initial = {k: (block, BlocksConfig.config_for_block(k, [], block))
               for k, block in config.blocks.items()}
    config.__class__ = _RememberedConfig
    config._initial = initial
