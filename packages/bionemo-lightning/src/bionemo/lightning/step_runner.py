"""Who runs a step of ``BionemoLightningModule``: NeMo's MegatronStrategy, or the module under Lightning's own.

The module asks :func:`step_runner_for` for the runner of its trainer's strategy and hands it every step and
optimizer hook; :class:`~bionemo.lightning.MegatronDataModule` asks it how the data is laid out (data-parallel
size, micro-batches per step, the training sampler and its resume position, the DataLoader class). Nothing else
tells the strategies apart. Two implementations of :class:`StepRunner`:

- :class:`LightningStepRunner` (here, plain Lightning and torch): Lightning's own strategies (CPU, one device,
  DDP) hand the module whole batches; the runner applies the data step, forward step and loss reduction itself,
  logs and returns the loss, uses the torch optimizer matching the connected ``OptimizerConfig`` and clips by its
  ``clip_grad``.
- ``MegatronStepRunner`` (:mod:`bionemo.lightning._nemo.step_runner`, the NeMo adapter): NeMo's
  ``MegatronStrategy`` runs the micro-batch loop and the loss reduction; the steps return model outputs and the
  optimizer is megatron's.

NeMo is imported only when a MegatronStrategy trainer drives the module: :func:`is_megatron_strategy` tells the
strategy by its class, without importing ``nemo``.
"""

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Sampler

from bionemo.lightning._parallel_init import ensure_model_parallel
from bionemo.lightning.global_batches import BatchLayout, GlobalBatchSampler
from bionemo.lightning.optimizer import torch_optimizer_from_config
from bionemo.lightning.prediction import with_sample_index
from bionemo.losses import ParallelGroups, all_reduce_sum

if TYPE_CHECKING:
    from bionemo.lightning.data import MegatronDataModule
    from bionemo.lightning.module import BionemoLightningModule

__all__ = [
    "LightningStep",
    "LightningStepRunner",
    "StepRunner",
    "fire_megatron_event",
    "is_megatron_strategy",
    "step_runner_for",
    "trainer_callbacks",
]

_MEGATRON_STRATEGY = ("nemo.", "MegatronStrategy")


@runtime_checkable
class StepRunner(Protocol):
    """What differs between the two ways a ``BionemoLightningModule`` is driven: steps, optimizer, data layout."""

    def prepare_model(self, module: "BionemoLightningModule") -> None:
        """Get ready for ``module``'s model to be built (called once, before ``config.configure_model``)."""
        ...

    def data_parallel_size(self, trainer: pl.Trainer) -> int:
        """Model replicas over ``trainer``'s processes (each takes a share of every global batch)."""
        ...

    def setup_data(self, data: "MegatronDataModule", trainer: pl.Trainer, stage: str, layout: BatchLayout) -> None:
        """Make ``trainer`` take ``layout``'s micro-batches per optimizer step in ``stage``."""
        ...

    def train_sampler(
        self, trainer: pl.Trainer, size: int, layout: BatchLayout, *, shuffle: bool, seed: int
    ) -> Sampler[int] | None:
        """This rank's training sampler over ``size`` samples from the resume position (``None``: the strategy's)."""
        ...

    def dataloader(self, mode: str) -> Callable[..., DataLoader]:
        """The DataLoader class (or factory) for ``mode`` (``train``, ``validation``, ``test``, ``predict``)."""
        ...

    def on_load_checkpoint(self, module: "BionemoLightningModule", checkpoint: dict[str, Any]) -> None:
        """Adjust a checkpoint being loaded before the trainer restores its loops from it."""
        ...

    def training_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """What ``training_step`` returns: the model output (Megatron) or the loss to minimize (Lightning)."""
        ...

    def validation_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """What ``validation_step`` returns: the model output (Megatron) or the reduced loss (Lightning)."""
        ...

    def test_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """What ``test_step`` returns: the model output (Megatron) or the reduced loss (Lightning)."""
        ...

    def predict_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """What ``predict_step`` returns for a non-empty batch (the model output, with ``sample_index``)."""
        ...

    def configure_optimizers(self, module: "BionemoLightningModule", megatron_parallel: Any = None) -> Any:
        """The optimizer(s) (and scheduler) for ``module``."""
        ...

    def before_optimizer_step(self, module: "BionemoLightningModule", optimizer: torch.optim.Optimizer) -> None:
        """Finish the step's gradients and step-level logs before ``optimizer`` steps (before clipping)."""
        ...

    def clip_gradients(
        self,
        module: "BionemoLightningModule",
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None,
        gradient_clip_algorithm: str | None,
    ) -> None:
        """Clip the gradients before ``optimizer`` steps, or leave it to the optimizer."""
        ...


def is_megatron_strategy(strategy: object) -> bool:
    """Whether ``strategy`` is (a subclass of) NeMo's ``MegatronStrategy``; imports nothing from ``nemo``."""
    prefix, name = _MEGATRON_STRATEGY
    return any(cls.__name__ == name and cls.__module__.startswith(prefix) for cls in type(strategy).__mro__)


def step_runner_for(trainer: pl.Trainer | None) -> StepRunner:
    """The runner for ``trainer``'s strategy; without a trainer, :class:`LightningStepRunner`'s."""
    if trainer is None or not is_megatron_strategy(trainer.strategy):
        return LIGHTNING_STEP_RUNNER
    from bionemo.lightning._nemo.step_runner import MEGATRON_STEP_RUNNER

    return MEGATRON_STEP_RUNNER


@dataclasses.dataclass
class _StepOutputs:
    """What the micro-batches of the current optimizer step returned, under Lightning's own strategies."""

    reduction: Any = None
    outputs: list[Any] = dataclasses.field(default_factory=list)
    num_tokens: list[torch.Tensor] = dataclasses.field(default_factory=list)
    """This rank's token counts, one per micro-batch, for token-weighted reductions."""

    @classmethod
    def of(cls, module: "BionemoLightningModule") -> "_StepOutputs":
        """``module``'s record of its current step (made on first use)."""
        step = module.__dict__.get("_lightning_step_outputs")
        if step is None:
            step = module.__dict__["_lightning_step_outputs"] = cls()
        return step

    def add(self, reduction: Any, reduced: Any, num_tokens: torch.Tensor | None) -> None:
        """Record one micro-batch."""
        self.reduction = reduction
        self.outputs.append(reduced)
        if num_tokens is not None:
            self.num_tokens.append(num_tokens)

    def clear(self) -> None:
        """Forget the step (after its optimizer step)."""
        self.reduction, self.outputs, self.num_tokens = None, [], []


@dataclasses.dataclass(frozen=True)
class LightningStep:
    """What megatron-event callbacks read of a step when Lightning's own strategy drives the module."""

    trainer: pl.Trainer
    pl_module: pl.LightningModule
    num_microbatches: int = 1


class LightningStepRunner:
    """Lightning's own strategies: the module runs data step, forward step and loss reduction per batch."""

    def prepare_model(self, module: "BionemoLightningModule") -> None:
        """Set up megatron's model-parallel state (size 1), which nobody else does off MegatronStrategy."""
        ensure_model_parallel(cuda=module.compute_device().type == "cuda")

    def data_parallel_size(self, trainer: pl.Trainer) -> int:
        """Every process is a model replica (no model parallelism on Lightning's strategies)."""
        return max(1, trainer.world_size)

    def setup_data(self, data: "MegatronDataModule", trainer: pl.Trainer, stage: str, layout: BatchLayout) -> None:
        """Training accumulates ``layout.accumulation`` micro-batches per step (the Trainer's own setting).

        An int ``val_check_interval`` keeps counting optimizer steps, as it does without accumulation.

        Raises:
            ValueError: The Trainer's own ``accumulate_grad_batches`` disagrees with the global batch.
        """
        if stage != "fit":
            return
        own, accumulation = trainer.accumulate_grad_batches, layout.accumulation
        if own not in (1, accumulation):
            raise ValueError(
                f"Trainer(accumulate_grad_batches={own}) disagrees with MegatronDataModule's global batch: "
                f"{layout} takes {accumulation} micro-batches per step; leave accumulate_grad_batches at 1 and set "
                "global_batch_size instead"
            )
        trainer.accumulate_grad_batches = accumulation
        # Lightning counts an int val_check_interval in batches (micro-batches here), given in optimizer steps
        steps = trainer.__dict__.setdefault("_bionemo_val_check_steps", trainer.val_check_interval)
        if isinstance(steps, int):
            trainer.val_check_interval = steps * accumulation

    def train_sampler(
        self, trainer: pl.Trainer, size: int, layout: BatchLayout, *, shuffle: bool, seed: int
    ) -> Sampler[int] | None:
        """This rank's share of every global batch (:class:`GlobalBatchSampler`), from the resume position.

        Lightning restarts an interrupted epoch's dataloader from its first batch while counting the batches
        done before the interruption (``batch_progress.current.processed``); the sampler then starts at the next
        step of that epoch, so a resumed run sees exactly the batches an uninterrupted one would, on any number
        of processes.
        """
        current = trainer.fit_loop.epoch_loop.batch_progress.current
        # a checkpoint saved in on_train_batch_end counts its batch as processed, not yet completed
        done = getattr(current, "processed", current.completed)
        start = done // layout.accumulation
        return GlobalBatchSampler(size, layout, rank=trainer.global_rank, start_step=start, shuffle=shuffle, seed=seed)

    def dataloader(self, mode: str) -> Callable[..., DataLoader]:
        """Torch's DataLoader."""
        return DataLoader

    def on_load_checkpoint(self, module: "BionemoLightningModule", checkpoint: dict[str, Any]) -> None:
        """Count the batch a mid-epoch checkpoint was saved after as completed, so the resumed loop is in step.

        Checkpoints saved in ``on_train_batch_end`` (periodic and interrupt ones) record that batch as processed
        but not completed; Lightning 2.4 resumes at the last completed batch (``reset_on_restart``), one batch
        behind the samples the sampler serves. With gradient accumulation that would shift every later optimizer
        step by a micro-batch.
        """
        loops = checkpoint.get("loops", {}).get("fit_loop", {})
        progress = loops.get("epoch_loop.batch_progress")
        for part in ("current", "total") if progress else ():
            counts = progress[part]
            counts["completed"] = max(counts["completed"], counts["processed"])

    def training_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """The loss to back-propagate for one micro-batch of the step's global batch.

        For a token-weighted reduction (``(loss_sum, num_tokens, reduced)``) that is the micro-batch's loss sum,
        scaled so that Lightning's division by ``accumulate_grad_batches`` and DDP's mean over ranks cancel;
        :meth:`before_optimizer_step` then divides the gradients by the step's global token count: the gradient
        of the global token-weighted mean over every micro-batch and rank, as megatron's
        ``calculate_per_token_loss``. Other reductions return their loss, averaged over micro-batches and ranks.
        """
        batch = module.data_step(iter([batch]))
        output = module.forward_step(batch)
        reduction = module.training_loss_reduction()
        result = reduction.forward(batch, output)
        step = _StepOutputs.of(module)
        if len(result) == 3:
            loss_sum, num_tokens, reduced = result
            step.add(reduction, reduced, num_tokens)
            trainer = module._trainer
            accumulation = trainer.accumulate_grad_batches if trainer is not None else 1
            return loss_sum * (accumulation * ParallelGroups.current().data_context_size())
        loss, reduced = result
        step.add(reduction, reduced, None)
        return loss

    def before_optimizer_step(self, module: "BionemoLightningModule", optimizer: torch.optim.Optimizer) -> None:
        """End the step: scale token-weighted gradients, log ``reduced_train_loss``, fire the step's reduce event.

        ``on_megatron_reduce_microbatches_end`` gets every micro-batch output of the step, as under
        MegatronStrategy.
        """
        step = _StepOutputs.of(module)
        if not step.outputs:
            return
        if step.num_tokens:
            groups = ParallelGroups.current()
            total = torch.stack([n.detach().to(torch.float32) for n in step.num_tokens]).sum()
            scale = 1.0 / all_reduce_sum(total, groups.data_context).clamp(min=1.0)
            for param in module.parameters():
                if param.grad is not None:
                    param.grad.mul_(scale.to(param.grad.device, param.grad.dtype))
        reduction, outputs = step.reduction, step.outputs
        step.clear()
        mean = reduction.reduce(outputs)
        module.log("reduced_train_loss", mean, prog_bar=True, batch_size=1)
        trainer = module._trainer
        if trainer is not None:
            fire_megatron_event(
                trainer_callbacks(trainer),
                "on_megatron_reduce_microbatches_end",
                step=LightningStep(trainer, module, num_microbatches=len(outputs)),
                loss_reduction=reduction,
                microbatch_outputs=outputs,
                reduced=mean,
            )

    def validation_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """The reduced validation loss, logged as ``val_loss``."""
        with torch.no_grad():
            _, mean = self._run_step(module, batch, module.validation_loss_reduction())
        module.log("val_loss", mean, prog_bar=True, on_epoch=True, batch_size=1)
        return mean

    def test_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """The reduced test loss, logged as ``test_loss``."""
        with torch.no_grad():
            _, mean = self._run_step(module, batch, module.test_loss_reduction())
        module.log("test_loss", mean, on_epoch=True, batch_size=1)
        return mean

    def predict_step(self, module: "BionemoLightningModule", batch: Any) -> Any:
        """The batch's model output through the module's ``predict_loss_reduction``."""
        batch = module.data_step(iter([batch]))
        output = with_sample_index(module.forward_step(batch), batch)
        reduction = module.predict_loss_reduction()
        _, reduced = reduction.forward(batch, output)
        return reduction.reduce([reduced])

    def configure_optimizers(self, module: "BionemoLightningModule", megatron_parallel: Any = None) -> Any:
        """The torch optimizer of the connected ``OptimizerConfig`` over megatron's parameter groups; its scheduler."""
        if module.optim is None:
            raise ValueError(
                "BionemoLightningModule(optimizer=None) can only predict; pass a MegatronOptimizerModule "
                "(e.g. bionemo.lightning.default_megatron_optimizer()) to train"
            )
        optimizer = torch_optimizer_from_config(
            module.optim.config,
            module.named_parameters(),
            getattr(module.optim, "scale_lr_cond", None),
            getattr(module.optim, "lr_mult", 1.0),
        )
        scheduler = getattr(module.optim, "lr_scheduler", None)
        return scheduler(module, optimizer) if scheduler is not None else optimizer

    def clip_gradients(
        self,
        module: "BionemoLightningModule",
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None,
        gradient_clip_algorithm: str | None,
    ) -> None:
        """Clip to the Trainer's ``gradient_clip_val``, else to the optimizer config's ``clip_grad`` (if any)."""
        configured = getattr(getattr(module.optim, "config", None), "clip_grad", 0.0)
        clip = gradient_clip_val if gradient_clip_val is not None else configured
        if clip:
            module.clip_gradients(
                optimizer, gradient_clip_val=clip, gradient_clip_algorithm=gradient_clip_algorithm or "norm"
            )

    def _run_step(
        self, module: "BionemoLightningModule", batch: Any, reduction: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-batch: data step, forward, loss reduction, ``on_megatron_reduce_microbatches_end``.

        Returns the loss to back-propagate and the reduced (global mean) loss to log. For a reduction
        returning ``(loss_sum, num_tokens, reduced)`` the loss is scaled so that DDP's gradient average is the
        gradient of the global token-weighted mean.
        """
        batch = module.data_step(iter([batch]))
        output = module.forward_step(batch)
        result = reduction.forward(batch, output)
        if len(result) == 3:
            loss_sum, num_tokens, reduced = result
            groups = ParallelGroups.current()
            total = all_reduce_sum(num_tokens.detach().to(torch.float32).clone(), groups.data_context)
            loss = loss_sum * groups.data_context_size() / total.clamp(min=1.0)
        else:
            loss, reduced = result
        mean = reduction.reduce([reduced])
        trainer = module._trainer
        if trainer is not None:
            fire_megatron_event(
                trainer_callbacks(trainer),
                "on_megatron_reduce_microbatches_end",
                step=LightningStep(trainer, module),
                loss_reduction=reduction,
                microbatch_outputs=[reduced],
                reduced=mean,
            )
        return loss, mean


def trainer_callbacks(trainer: pl.Trainer) -> list[pl.Callback]:
    """The trainer's callbacks (none for a stand-in trainer without them)."""
    return list(getattr(trainer, "callbacks", []))


def fire_megatron_event(callbacks: Iterable[object], name: str, **kwargs: Any) -> None:
    """Call hook ``name`` on each callback that has it, as NeMo's ``CallbackConnector.event`` does.

    Each hook gets the keyword arguments its signature names (all of them if it takes ``**kwargs``).
    """
    for callback in callbacks:
        hook = getattr(callback, name, None)
        if not callable(hook):
            continue
        params = inspect.signature(hook).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            hook(**kwargs)
        else:
            hook(**{key: value for key, value in kwargs.items() if key in params})


LIGHTNING_STEP_RUNNER = LightningStepRunner()
"""The runner for Lightning's own strategies (it holds no state)."""
