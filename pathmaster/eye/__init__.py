"""The eye: a frozen, general-purpose network pretrained on ImageNet, as a cell's describer."""
