"""Training data: Megatron's indexed dataset format, tokenizers, preparation and GPT samples.

Everything here is numpy and the standard library (torch is never imported), so the CLI can
prepare data and the submit path can check it without starting the training stack.
"""
