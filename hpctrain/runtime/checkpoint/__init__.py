"""Checkpoints: sharded save/load with megatron-core's dist_checkpointing, published only when
complete (``store``), built and restored per rank (``state``), coordinated across ranks
(``manager``)."""
