"""The design article's LitModel, as its readers write it (`import pytorch_lightning as pl`), made runnable.

Two changes from the article's listing: the `F` it uses is imported, and it trains
torchvision's resnet18 (the article's resnet50 is slow on a CPU). Train it with

    PYTHONPATH=examples dtrain run examples/lit-model.yaml

dtrain trains it with pytorch_lightning's own Trainer, callbacks and checkpointing,
because that is the package the class is built on.
"""

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
import torchvision


class LitModel(pl.LightningModule):
    def __init__(self, num_classes: int = 10, lr: float = 1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.model = torchvision.models.resnet18(weights=None, num_classes=num_classes)
        # Lets dtrain export the model to ONNX without export.onnx.inputShape.
        self.example_input_array = torch.zeros(1, 3, 32, 32)

    def forward(self, x):
        return self.model(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        y_hat = self(x)
        loss = F.cross_entropy(y_hat, y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
