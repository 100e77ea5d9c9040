"""Job files for the planner tests, written as the mappings a user's YAML would hold."""

from __future__ import annotations

import copy

from hpctrain.config import job_from_mapping

# Architectures with published parameter counts. Sources are cited where they are used.
LLAMA2_7B = dict(num_layers=32, hidden_size=4096, num_attention_heads=32, ffn_hidden_size=11008,
                 vocab_size=32000, seq_length=4096, position_embedding_type="rope",
                 activation="swiglu", normalization="RMSNorm", add_bias_linear=False,
                 untie_embeddings_and_output_weights=True, attention_backend="flash")
LLAMA2_13B = dict(LLAMA2_7B, num_layers=40, hidden_size=5120, num_attention_heads=40,
                  ffn_hidden_size=13824)
LLAMA3_8B = dict(LLAMA2_7B, num_query_groups=8, ffn_hidden_size=14336, vocab_size=128256,
                 seq_length=8192)
MISTRAL_7B = dict(LLAMA2_7B, num_query_groups=8, ffn_hidden_size=14336, seq_length=8192)
GPT2_SMALL = dict(num_layers=12, hidden_size=768, num_attention_heads=12, vocab_size=50257,
                  make_vocab_size_divisible_by=1, seq_length=1024, activation="gelu",
                  normalization="LayerNorm", add_bias_linear=True,
                  untie_embeddings_and_output_weights=False)
GPT2_MEDIUM = dict(GPT2_SMALL, num_layers=24, hidden_size=1024, num_attention_heads=16)

# Small models the CPU builds in milliseconds, covering every knob that changes the count.
TINY_GPT = dict(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=250,
                seq_length=32, attention_backend="local")
TINY_LLAMA = dict(TINY_GPT, num_query_groups=2, ffn_hidden_size=96, activation="swiglu",
                  normalization="RMSNorm", add_bias_linear=False, position_embedding_type="rope",
                  untie_embeddings_and_output_weights=True)


def job_mapping(model: dict, *, precision: str = "bf16", mbs: int = 1, gbs: int | None = None,
                parallel: dict | None = None, train: dict | None = None) -> dict:
    return {
        "name": "plan-test",
        "model": copy.deepcopy(model),
        "parallel": dict(parallel or {}),
        "batch": {"micro_batch_size": mbs, "global_batch_size": gbs or mbs},
        "train": {"steps": 1, "precision": precision, **(train or {})},
        "data": {"path": "unused"},
    }


def make_job(model: dict, **kwargs):
    return job_from_mapping(job_mapping(model, **kwargs), "plan-test")
