"""The parallelism and memory planner behind ``hpctrain plan`` (pure Python, no torch import).

Parameter counts and weight/gradient/optimizer bytes replay what megatron-core allocates; the
activation memory follows Korthikanti et al. 2022 generalized to GQA and SwiGLU; the step time
is an estimate from the profile's peak FLOP/s and bus bandwidths, for ranking layouts.
"""

from ..model_shape import ModelShape, ParameterCount, count_parameters
from .activations import activation_bytes_per_layer, activation_terms, stage_activations
from .fit import FitCheck, check_fits
from .layouts import (LayoutPlan, MemoryBreakdown, PlanResult, Target, explain_layout,
                      plan_layout, plan_layouts)
from .memory import state_bytes_for_parameters, state_bytes_per_pipeline_rank

__all__ = ["FitCheck", "LayoutPlan", "MemoryBreakdown", "ModelShape", "ParameterCount",
           "PlanResult", "Target", "activation_bytes_per_layer", "activation_terms",
           "check_fits", "count_parameters", "explain_layout", "plan_layout", "plan_layouts",
           "stage_activations", "state_bytes_for_parameters", "state_bytes_per_pipeline_rank"]
