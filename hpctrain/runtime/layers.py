"""Which transformer layers a rank builds: Transformer Engine's spec or megatron-core's local one.

``model.transformer_impl`` is Megatron-LM's ``--transformer-impl`` (default
``transformer_engine``):

* **transformer_engine** on CUDA: TE's layer spec — fused or flash attention
  (``model.attention_backend``; megatron sets TE's ``NVTE_*_ATTN`` switches from it), LayerNorm
  fused into the following linear, and TE's fused RoPE. When TE cannot be imported the rank
  stops *before building anything*, with the import error and the fix: no silent fallback to
  the local spec, which runs unfused O(s²) attention and, with its softmax fusion on, crashes
  at the first forward without apex's kernels.
* **local**: megatron-core's own modules with, by default, torch's fused attention in the
  ``core_attention`` seam (``hpctrain.runtime.fused_attention``: ``model.attention_backend``
  auto, flash or fused picks torch's kernels; ``local`` or ``unfused`` keeps megatron's own
  unfused ``DotProductAttention``); on CUDA every fusion whose kernel can be imported —
  the masked-softmax fusion needs apex's ``scaled_upper_triang_masked_softmax_cuda``,
  ``scaled_masked_softmax_cuda`` and ``scaled_softmax_cuda`` (``megatron/core/fusions/
  fused_softmax.py`` imports them inside the forward), gradient-accumulation fusion apex's
  ``fused_weight_gradient_mlp_cuda`` (the GPT output layer is megatron's own
  ``ColumnParallelLinear`` in both specs and needs it), while the bias+activation and
  bias+dropout fusions are megatron's ``jit_fuser`` (torch.compile / TorchScript) and always
  available on CUDA. RoPE fusion is TE's kernel with TE, torch.compile's with the local spec
  (``hpctrain.runtime.rope``); the native cross-entropy fusion runs in bf16 (``_with_speedups``).
* **CPU** (the rehearsal) always builds the local spec with every fusion off (they are CUDA
  kernels) and says so when the job asks for Transformer Engine; its attention follows the
  job as on a GPU (torch's CPU flash kernel for the fused choices).

Imports torch/TE only inside functions: :func:`launch_warnings` runs in the CLI.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field

from ..errors import HpcTrainError

TRANSFORMER_ENGINE = "transformer_engine"
LOCAL = "local"
TORCH_SDPA = "torch_sdpa"                 # hpctrain.runtime.fused_attention
MEGATRON_UNFUSED = "megatron_unfused"     # megatron-core's DotProductAttention
UNFUSED_CHOICES = ("local", "unfused")    # model.attention_backend values that keep it
APEX_SOFTMAX_KERNELS = ("scaled_upper_triang_masked_softmax_cuda", "scaled_masked_softmax_cuda",
                        "scaled_softmax_cuda")
APEX_WGRAD_KERNEL = "fused_weight_gradient_mlp_cuda"
FIX_INSTALL = ("install Transformer Engine in the nodes' environment (NGC PyTorch containers "
               "ship it; else pip install --no-build-isolation 'transformer_engine[pytorch]' "
               "matching the node's CUDA and torch)")


class LayerImplError(HpcTrainError):
    """The job's layer implementation cannot run here."""


@dataclass(frozen=True)
class LayerImpl:
    name: str                 # transformer_engine | local
    attention_backend: str    # megatron's AttnBackend name: auto/flash/fused/unfused/local
    fusions: dict = field(default_factory=dict)   # TransformerConfig field -> on/off
    te_version: str | None = None
    notes: tuple = ()
    # the local spec's core attention: torch_sdpa (with these torch kernels, in order) or
    # megatron_unfused; None for Transformer Engine's spec (TE picks its own)
    core_attention: str | None = None
    sdpa_kernels: tuple = ()

    def attention_name(self) -> str:
        if self.core_attention == TORCH_SDPA:
            return f"torch sdpa [{','.join(self.sdpa_kernels)}]"
        if self.core_attention == MEGATRON_UNFUSED:
            return "megatron unfused"
        return self.attention_backend

    def describe(self) -> str:
        on = [k.replace("_fusion", "") for k, v in self.fusions.items() if v]
        te = f" {self.te_version}" if self.te_version else ""
        return (f"layers {self.name}{te}, attention {self.attention_name()}, fusions "
                f"{'+'.join(on) if on else 'none'}")

    def record(self) -> dict:
        """For result.json and the checkpoint manifest."""
        return {"transformer_impl": self.name, "attention_backend": self.attention_backend,
                "core_attention": self.core_attention, "sdpa_kernels": list(self.sdpa_kernels),
                "fusions": sorted(k for k, v in self.fusions.items() if v),
                "transformer_engine": self.te_version}


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:   # noqa: BLE001 - a kernel that fails to load is a kernel we cannot use
        return False
    return True


def transformer_engine_import_error() -> str | None:
    """None when TE and megatron's TE modules import; else what went wrong, in one line."""
    try:
        te = importlib.import_module("transformer_engine.pytorch")  # noqa: F841
        from megatron.core.extensions import transformer_engine as mte  # noqa: F401
        from megatron.core.models.gpt import gpt_layer_specs
        if not getattr(gpt_layer_specs, "HAVE_TE", False):
            return "megatron.core.models.gpt.gpt_layer_specs could not import Transformer Engine"
    except Exception as e:   # noqa: BLE001 - reported to the user, not swallowed
        return f"{type(e).__name__}: {e}".splitlines()[0]
    return None


def transformer_engine_version() -> str | None:
    try:
        from importlib import metadata
        for dist in ("transformer_engine", "transformer-engine", "transformer_engine_torch"):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        te = importlib.import_module("transformer_engine")
        return getattr(te, "__version__", None)
    except Exception:   # noqa: BLE001 - a version for a log line only
        return None


def _rope_fusion_available() -> bool:
    try:
        from megatron.core.models.common.embeddings import rope_utils
    except Exception:   # noqa: BLE001
        return False
    return rope_utils.fused_apply_rotary_pos_emb is not None


_cache: dict = {}


def choose(job, device: str) -> LayerImpl:
    """The layer implementation for ``job`` on ``device``; raises :class:`LayerImplError` when
    the job's choice cannot run here (call it before building the model)."""
    m = job.model
    wanted = getattr(m, "transformer_impl", TRANSFORMER_ENGINE)
    deterministic = bool(getattr(job.train, "deterministic_mode", False))
    rope = getattr(m, "apply_rope_fusion", True)
    cross_entropy = (getattr(m, "cross_entropy_loss_fusion", True) and device == "cuda"
                     and job.train.precision == "bf16" and not deterministic)
    key = (wanted, m.attention_backend, m.position_embedding_type, device, deterministic, rope,
           cross_entropy)
    if key not in _cache:
        impl = _choose(wanted, m.attention_backend, m.position_embedding_type, device)
        impl = _with_core_attention(impl, m.attention_backend, device, deterministic)
        _cache[key] = _with_speedups(impl, device, m.position_embedding_type == "rope" and rope,
                                     cross_entropy)
    return _cache[key]


def _with_speedups(impl: LayerImpl, device: str, rope: bool, cross_entropy: bool) -> LayerImpl:
    """Megatron-LM's fusions that run without Transformer Engine or apex, on GPUs:

    * RoPE in one kernel (``model.apply_rope_fusion``, Megatron-LM's default): Transformer
      Engine's where it imports, else megatron-core's own RoPE compiled by torch.compile
      (``hpctrain.runtime.rope``): the same formula, computed in fp32 inside one kernel;
    * the cross entropy's native fusion (``model.cross_entropy_loss_fusion``): megatron-core's
      ``fused_vocab_parallel_cross_entropy`` (its elementwise parts compiled by
      torch.compile), whose logits gradient is bf16 by construction: what the unfused loss
      gives for bf16 logits, so it is used in bf16 only, and never in deterministic mode
      (Megatron-LM refuses it there).
    """
    import dataclasses
    if device != "cuda":
        return impl
    fusions = dict(impl.fusions)
    fusions["apply_rope_fusion"] = rope and (fusions.get("apply_rope_fusion", False)
                                             or impl.name == LOCAL)
    fusions["cross_entropy_loss_fusion"] = cross_entropy
    return dataclasses.replace(impl, fusions=fusions)


def _with_core_attention(impl: LayerImpl, backend: str, device: str,
                         deterministic: bool) -> LayerImpl:
    """The local spec's core attention: torch's fused kernels unless the job keeps megatron's
    unfused attention by name."""
    import dataclasses
    if impl.name != LOCAL:
        return impl
    if backend in UNFUSED_CHOICES:
        return dataclasses.replace(impl, core_attention=MEGATRON_UNFUSED)
    from . import fused_attention
    try:
        kernels = fused_attention.kernel_order(backend, device, deterministic)
    except fused_attention.KernelChoiceError as e:
        raise LayerImplError(str(e)) from None
    notes = tuple(n for n in impl.notes if not n.startswith("layers: megatron-core's local "
                                                            "spec on GPU"))
    if device == "cuda":
        notes += (f"layers: megatron-core's local spec on GPU (model.transformer_impl: local) "
                  f"with torch's fused attention (kernels tried in order: "
                  f"{fused_attention.describe_kernels(kernels)})",)
    return dataclasses.replace(impl, core_attention=TORCH_SDPA,
                               sdpa_kernels=tuple(fused_attention.kernel_name(k)
                                                  for k in kernels), notes=notes)


def _choose(wanted: str, backend: str, position: str, device: str) -> LayerImpl:
    off = {"masked_softmax_fusion": False, "bias_activation_fusion": False,
           "bias_dropout_fusion": False, "gradient_accumulation_fusion": False,
           "apply_rope_fusion": False}
    if device != "cuda":
        notes = ()
        if wanted == TRANSFORMER_ENGINE:
            notes = ("layers: megatron-core's local spec on CPU (the job's model.transformer_impl: "
                     "transformer_engine needs CUDA; GPUs will run Transformer Engine)",)
        return LayerImpl(LOCAL, "local", off, None, notes)
    wgrad = _importable(APEX_WGRAD_KERNEL)
    if wanted == TRANSFORMER_ENGINE:
        if backend == "local":
            raise LayerImplError(
                "model.attention_backend: local is megatron-core's unfused attention of the local "
                "layer spec; with Transformer Engine use auto, flash, fused or unfused, or set "
                "model.transformer_impl: local")
        error = transformer_engine_import_error()
        if error is not None:
            raise LayerImplError(
                f"model.transformer_impl: transformer_engine, but Transformer Engine cannot be "
                f"imported on this node ({error}); {FIX_INSTALL}, or set model.transformer_impl: "
                f"local (megatron-core's own layers: unfused attention, slower)")
        fusions = {**off, "masked_softmax_fusion": True, "bias_activation_fusion": True,
                   "bias_dropout_fusion": True, "gradient_accumulation_fusion": wgrad,
                   "apply_rope_fusion": position == "rope" and _rope_fusion_available()}
        return LayerImpl(TRANSFORMER_ENGINE, backend, fusions, transformer_engine_version())
    softmax = all(_importable(k) for k in APEX_SOFTMAX_KERNELS)
    fusions = {**off, "masked_softmax_fusion": softmax, "bias_activation_fusion": True,
               "bias_dropout_fusion": True, "gradient_accumulation_fusion": wgrad}
    notes = ["layers: megatron-core's local spec on GPU (model.transformer_impl: local): "
             "unfused attention, its memory grows with the square of the sequence"]
    if not softmax:
        notes.append("masked softmax fusion off: apex's softmax kernels are not importable "
                     f"({', '.join(APEX_SOFTMAX_KERNELS)})")
    return LayerImpl(LOCAL, "local", fusions, None, tuple(notes))


def layer_spec(job, impl: LayerImpl):
    """megatron-core's ModuleSpec for one transformer layer of ``impl``."""
    from megatron.core.models.gpt import gpt_layer_specs as specs
    if impl.name == TRANSFORMER_ENGINE:
        return specs.get_gpt_layer_with_transformer_engine_spec()
    spec = specs.get_gpt_layer_local_spec(normalization=job.model.normalization)
    if impl.core_attention == TORCH_SDPA:
        spec = with_fused_attention(spec, impl)
    return spec


def with_fused_attention(spec, impl: LayerImpl):
    """``spec`` (the local layer spec) with torch's fused attention in its core_attention seam."""
    import dataclasses

    from megatron.core.transformer.spec_utils import ModuleSpec

    from . import fused_attention
    kernels = fused_attention.kernels_by_name(impl.sdpa_kernels)
    attention = spec.submodules.self_attention
    core = ModuleSpec(module=fused_attention.TorchFusedAttention, params={"kernels": kernels})
    submodules = dataclasses.replace(attention.submodules, core_attention=core)
    return dataclasses.replace(spec, submodules=dataclasses.replace(
        spec.submodules, self_attention=dataclasses.replace(attention, submodules=submodules)))


def launch_warnings(job, profile) -> list[str]:
    """What ``hpctrain validate/submit`` can say about the layers without importing torch: the
    ranks decide (they import TE), this only flags the likely surprises."""
    if getattr(profile.node, "device", "cuda") != "cuda":
        return []
    wanted = getattr(job.model, "transformer_impl", TRANSFORMER_ENGINE)
    if wanted == LOCAL:
        if job.model.attention_backend in UNFUSED_CHOICES:
            return [f"model.transformer_impl: local with attention_backend: "
                    f"{job.model.attention_backend} on GPUs runs megatron-core's unfused "
                    f"attention (its memory grows with the square of the sequence); auto "
                    f"uses torch's fused kernels"]
        return []
    if job.model.attention_backend == "local":
        return ["model.attention_backend: local needs model.transformer_impl: local; with "
                "Transformer Engine the ranks will stop (use auto, flash, fused or unfused)"]
    if not getattr(profile.container, "image", None) and \
            importlib.util.find_spec("transformer_engine") is None:
        return ["Transformer Engine is not installed in this Python environment; the ranks "
                "need it on the nodes (model.transformer_impl: transformer_engine) and stop "
                "at start without it"]
    return []


TE_ATTENTION_STATE_MODULES = (
    "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention",  # TE 2.x
    "transformer_engine.pytorch.attention",                                               # TE 1.x
)


def attention_in_use(impl: LayerImpl) -> str | None:
    """After a forward: the attention kernel actually running. TE picks flash, fused (cuDNN)
    or unfused per shape and GPU at the first forward and keeps its choice in a module global
    (``_attention_backends``); the local spec always runs megatron's unfused attention. None
    when TE's bookkeeping is not where this version keeps it (the log then shows the request)."""
    if impl.name == LOCAL:
        if impl.core_attention == TORCH_SDPA:
            from . import fused_attention
            return fused_attention.kernel_in_use() or impl.attention_name()
        return "local (megatron-core unfused)"
    for name in TE_ATTENTION_STATE_MODULES:
        try:
            chosen = getattr(importlib.import_module(name), "_attention_backends", None)
        except Exception:   # noqa: BLE001 - a log detail, never a failure
            continue
        if not isinstance(chosen, dict):
            continue
        if chosen.get("use_flash_attention"):
            backend = chosen.get("flash_attention_backend")
            return "flash" + (f" ({backend})" if backend else "")
        if chosen.get("use_fused_attention"):
            backend = chosen.get("fused_attention_backend")
            return "fused (cuDNN" + (f", {backend})" if backend is not None else ")")
        if chosen.get("use_unfused_attention"):
            return "unfused (Transformer Engine)"
    return None
