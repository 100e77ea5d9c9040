"""Parameter counts: published figures of open models, and how TP/PP/VPP split them."""

from __future__ import annotations

import pytest
from plan_jobs import (GPT2_MEDIUM, GPT2_SMALL, LLAMA2_7B, LLAMA2_13B, LLAMA3_8B, MISTRAL_7B,
                       TINY_GPT, TINY_LLAMA, make_job)

from hpctrain.planner import ModelShape, count_parameters


def shape(model: dict) -> ModelShape:
    return ModelShape.from_job(make_job(model))


@pytest.mark.parametrize("model, published", [
    # Touvron et al. 2023 (Llama 2); the sum of meta-llama/Llama-2-7b-hf's safetensors shapes.
    (LLAMA2_7B, 6_738_415_616),
    # meta-llama/Llama-2-13b-hf, same source.
    (LLAMA2_13B, 13_015_864_320),
    # meta-llama/Meta-Llama-3-8B (GQA, 8 KV heads, 128,256-token vocabulary).
    (LLAMA3_8B, 8_030_261_248),
    # mistralai/Mistral-7B-v0.1 (GQA, 8 KV heads).
    (MISTRAL_7B, 7_241_732_096),
    # Hugging Face gpt2 / gpt2-medium: GPTModel.num_parameters() (tied, learned positions,
    # biases, LayerNorm; vocabulary 50,257 unpadded, hence make_vocab_size_divisible_by: 1).
    (GPT2_SMALL, 124_439_808),
    (GPT2_MEDIUM, 354_823_168),
], ids=["llama2-7b", "llama2-13b", "llama3-8b", "mistral-7b", "gpt2", "gpt2-medium"])
def test_published_parameter_counts(model, published):
    assert count_parameters(shape(model)).total == published


def test_vocabulary_padding_adds_whole_rows():
    padded = dict(GPT2_SMALL, make_vocab_size_divisible_by=128)
    count = count_parameters(shape(padded))
    assert count.padded_vocab_size == 50304
    assert count.total - 124_439_808 == (50304 - 50257) * 768


def test_llama2_7b_on_two_tensor_parallel_ranks():
    # Each TP rank holds half of every matrix and the whole of every norm (2 per layer + final).
    norms = (2 * 32 + 1) * 4096
    count = count_parameters(shape(LLAMA2_7B), tp=2)
    assert count.most_loaded_rank == (6_738_415_616 - norms) // 2 + norms


@pytest.mark.parametrize("model", [TINY_GPT, TINY_LLAMA, GPT2_SMALL, LLAMA3_8B],
                         ids=["tied-gelu", "untied-swiglu-gqa", "gpt2", "llama3-8b"])
@pytest.mark.parametrize("pp, vpp", [(2, None), (4, None), (2, 2)])
def test_pipeline_stages_add_up_to_the_model(model, pp, vpp):
    s = shape(model)
    count = count_parameters(s, 1, pp, vpp)
    copy = s.padded_vocab(1) * s.hidden_size if s.tied_output else 0
    # a tied output layer is a second copy of the embedding on the last stage
    assert sum(count.per_pipeline_rank) == count.total + copy
    first, last = count.per_pipeline_rank[0], count.per_pipeline_rank[-1]
    assert count.most_loaded_rank == max(first, last)
    middle = count.per_pipeline_rank[1:-1]
    assert all(m < min(first, last) for m in middle)
