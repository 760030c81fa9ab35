"""A fine-tuned ESM-2 on megatron-core: the encoder without its language-model head, a task head on its hidden states.

:class:`ESM2FinetuneConfig` is an ``ESM2Config`` that also holds the :class:`~bionemo.esm2.finetune.spec.FinetuneSpec`
(as JSON, so megatron's and NeMo's config handling sees a plain string); it builds :class:`ESM2FinetuneModel`, whose
state-dict names are ``ESM2Model``'s (without ``lm_head.`` / ``output_layer.``) plus the head's under ``head.``
(the layout of a fine-tuned ``model.safetensors``, :mod:`bionemo.esm2.finetune.spec`), and the loss reduction of its
task (:class:`~bionemo.esm2.finetune.reduction.FinetuneLossReduction`).
"""

import json
from dataclasses import dataclass
from typing import Any

import torch

from bionemo.esm2.finetune.class_weights import ClassWeights
from bionemo.esm2.finetune.heads import build_head
from bionemo.esm2.finetune.label_scaling import LabelScaling
from bionemo.esm2.finetune.reduction import task_reduction
from bionemo.esm2.finetune.spec import EncoderMode, FinetuneSpec
from bionemo.esm2.model.esm2 import ESM2Config, ESM2Model
from bionemo.lightning import UnpaddedSequences

__all__ = ["ESM2FinetuneConfig", "ESM2FinetuneModel"]


@dataclass
class ESM2FinetuneConfig(ESM2Config):
    """An ``ESM2Config`` plus the fine-tuning spec; builds :class:`ESM2FinetuneModel`."""

    finetune: str = "{}"
    """:meth:`FinetuneSpec.to_json` as a JSON string."""

    label_scaling: str = "null"
    """Training only: :meth:`~bionemo.esm2.finetune.label_scaling.LabelScaling.to_json` of a regression run's labels
    (the model's outputs are the head's scaled and shifted), or ``"null"``; exported models have it folded in."""

    class_weights: str = "null"
    """Training only: :meth:`~bionemo.esm2.finetune.class_weights.ClassWeights.to_json` of a classification run's
    loss weights per class (``--class-weights``), or ``"null"``."""

    @property
    def spec(self) -> FinetuneSpec:
        """The fine-tuning spec this config holds.

        Raises:
            ValueError: ``finetune`` holds no valid spec.
        """
        return FinetuneSpec.from_json(json.loads(self.finetune))

    def configure_model(self, *args: Any, **kwargs: Any) -> "ESM2FinetuneModel":
        """Build the fine-tuned model for this rank's pipeline stage (the head on the last stage)."""
        from megatron.core import parallel_state

        return ESM2FinetuneModel(
            self,
            self.spec,
            pre_process=parallel_state.is_pipeline_first_stage(),
            post_process=parallel_state.is_pipeline_last_stage(),
            label_scaling=LabelScaling.from_json(self.label_scaling),
        )

    def get_loss_reduction_class(self) -> Any:
        """The task's loss reduction (:func:`~bionemo.esm2.finetune.reduction.task_reduction`).

        Called as the class is (``reduction(validation_step=...)``); carries the class's ``token_weighted``.
        """
        return task_reduction(
            self.spec.task, LabelScaling.from_json(self.label_scaling), ClassWeights.from_json(self.class_weights)
        )


class ESM2FinetuneModel(ESM2Model):
    """The ESM-2 encoder and a task head: ``forward(input_ids [b, s], attention_mask, residue_mask) -> head logits``.

    Sequence heads return ``[b, k]``, token heads ``[b, s, k]`` (:mod:`bionemo.esm2.finetune.heads`). Stages before
    the last return their hidden states ``[s, b, h]`` for the next. With ``encoder=frozen`` the encoder's parameters
    do not require gradients; LoRA adapters are added by the caller (:func:`bionemo.layers.apply_lora`).
    """

    def __init__(
        self,
        config: ESM2Config,
        spec: FinetuneSpec,
        pre_process: bool = True,
        post_process: bool = True,
        label_scaling: LabelScaling | None = None,
    ) -> None:
        super().__init__(config, pre_process=pre_process, post_process=post_process, lm_head=False)
        self.spec = spec
        self.label_scaling = label_scaling
        if spec.encoder is EncoderMode.FROZEN:
            for param in self.parameters():
                param.requires_grad_(False)
        if post_process:
            device = "cpu" if config.use_cpu_initialization else torch.cuda.current_device()
            self.head = build_head(spec.head, config.hidden_size, spec.num_outputs).to(device, config.params_dtype)

    def forward(  # type: ignore[override]
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        residue_mask: torch.Tensor,
        unpadded: UnpaddedSequences | None = None,
        index: torch.Tensor | None = None,
        sample_index: torch.Tensor | None = None,
        output_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The head's logits of right-padded ``input_ids [b, s]`` (``residue_mask [b, s]``: True on residues).

        ``unpadded`` (with ``index``, :func:`bionemo.esm2.model.packing.unpad`'s): ``input_ids [1, T]`` holds the
        batch's real tokens concatenated and the hidden states are put back to ``[s, b, h]`` before the head.
        ``output_hidden=True`` returns ``(logits, hidden [s, b, h])``: the encoder's last hidden states (after the
        final LayerNorm) too, zeros at padding when ``unpadded``. ``sample_index [b]`` (each sample's dataset
        position) keys the head's dropout masks, so that they do not depend on the parallel layout.
        """
        out = super().forward(input_ids, attention_mask, output_hidden=True, output_logits=False, unpadded=unpadded)
        if not self.post_process:
            return out
        hidden = out[1]  # [s, b, h] or [T, 1, h]
        if unpadded is not None:
            from bionemo.esm2.model.packing import repad

            assert index is not None, "unpadded needs the index that puts the tokens back"
            hidden = repad(hidden, index, *residue_mask.shape)
        logits = self.head(hidden.transpose(0, 1), residue_mask, sample_index)
        if self.label_scaling is not None:
            logits = self.label_scaling.apply(logits)
        return (logits, hidden) if output_hidden else logits
