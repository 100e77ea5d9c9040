"""Checkpoints with megatron-core's dist_checkpointing, published only when complete.

``store``: the folder on disk (manifest, publish, verify, quarantine, prune; no torch);
``state``: what a checkpoint holds and how it goes back into a live model and optimizer;
``manager``: save and resume across all ranks; ``weights``: model-only checkpoints
(``train.init_from``); ``results_queue``: what megatron-core's writer reports through.
"""
