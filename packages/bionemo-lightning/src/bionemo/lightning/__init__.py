"""BionemoLightningModule: one Lightning module for Megatron-core models."""
