"""Progress output: a rich progress bar on a terminal."""

from __future__ import annotations

from lightning.pytorch.callbacks import RichProgressBar


class ProgressBar(RichProgressBar):
    """Lightning's rich progress bar; with max_epochs=-1 (training by steps) the label is "Epoch N", not
    "Epoch N/-2". The bar's total is already the steps left to max_steps."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs is not None and self.trainer.max_epochs < 0:
            return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"
        return super()._get_train_description(current_epoch)


