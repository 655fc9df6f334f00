"""The reference torch trainer (GRPO/REINFORCE on the tiny model), run in-process by local mode or as `python -m rljob_client.trainer` in a pod."""
